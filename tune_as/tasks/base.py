"""The `Task` protocol shared by every task family: load, carve, label, featurize, predict, score."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..errors import clip, excerpt
from . import metrics
from .data import DataSettings, PreparedData, Split
from .labels import LabelMap
from .sources import HubSource, RawSplit, carve, load_folder, load_hub, shared_data_root, subsample

log = logging.getLogger(__name__)
DEFAULT_STEMS = {
    "train": ("train",),
    "validation": ("validation", "validation_matched", "dev", "valid"),
    "test": ("test", "test_matched"),
}


@dataclass(frozen=True)
class TaskDefaults:
    """Training defaults: the AS-Softmax paper's Table 5 where it has the task, else documented choices."""

    epochs: int
    batch_size: int
    lr: float
    max_length: int
    backbone: str


@dataclass
class Task:
    """A registry entry. Families (text, token, multilabel, images) override `label_values`, `examples`,
    `featurize` and, where the metric needs it, `predict` / `score`.

    carve: splits to carve from train (with a fixed seed) when the source has none, and their fraction.
    Test is never carved unless listed: GLUE keeps test=None because its test labels are hidden.
    options: the `build_task` options that made this task (`jsonl`); copied to PreparedData.task_options so
    a trial can rebuild the same task with `build_task(data.task, **data.task_options)`.
    shared_copy: the folder of a local copy under `sources.shared_data_root()` (goemotions), read instead of
    the hub when no data_dir is given and the folder exists (`default_data_dir`).
    """

    name: str
    kind: str
    metrics: tuple[str, ...]
    defaults: TaskDefaults
    hub: HubSource | None
    stems: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_STEMS))
    carve: tuple[tuple[str, float], ...] = (("validation", 0.1),)
    fields: dict[str, tuple[str, ...]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    shared_copy: str | None = None

    family: ClassVar[str] = "base"
    uses_backbone: ClassVar[bool] = True  # False for images: their CNN has no frozen mode

    def fingerprint(self) -> dict[str, Any]:
        """Everything besides the DataSettings that changes prepared data (part of the cache key)."""
        fields = dataclasses.asdict(self)
        del fields["defaults"], fields["metrics"]  # training defaults and metrics do not change the data
        del fields["shared_copy"]  # the folder it resolves to is the spec's data_dir, which is in the key
        return dict(fields, family=self.family)

    def default_data_dir(self) -> Path | None:
        """The local copy `prepare` reads when no data_dir is given, if this task has one and it exists."""
        if self.shared_copy is None:
            return None
        folder = shared_data_root() / self.shared_copy
        return folder if folder.is_dir() else None

    # -- data -----------------------------------------------------------------------------------------
    def load_raw(self, data_dir: Path | None) -> dict[str, RawSplit]:
        if data_dir is not None:
            return load_folder(data_dir, self.stems)
        if self.hub is None:
            raise ValueError(f"task {self.name!r} has no Hugging Face hub dataset: expected a data_dir")
        return load_hub(self.hub, self.stems)

    def raw_splits(self, data_dir: Path | None) -> tuple[dict[str, RawSplit], list[str]]:
        raw, notes = self.load_raw(data_dir), []
        for split, rows in raw.items():
            if not len(rows):
                raise ValueError(f"{rows.origin}: expected rows in the {split} split, found none")
        for split, fraction in self.carve:
            if split not in raw:
                raw["train"], raw[split] = carve(raw["train"], fraction, split)
                notes.append(f"{self.name}: no {split} split in {raw['train'].origin}; carved "
                             f"{len(raw[split])} rows ({fraction:.0%}) from train with a fixed seed")
        if "validation" not in raw:
            raise ValueError(f"{self.name}: expected a validation split, found splits {sorted(raw)}")
        # not logged here: a cached run would not say them (engine.run prints them, the answer keeps them)
        return raw, notes

    def build(self, spec: DataSettings) -> PreparedData:
        """Load, label, subsample and featurize (uncached; `tasks.prepare` wraps this in the disk cache)."""
        raw, notes = self.raw_splits(spec.data_dir)
        train = raw["train"]
        labels = self.fit_labels(train).titled(self.label_titles(spec.data_dir))
        used: dict[str, RawSplit] = {}  # the rows each split keeps (after subsampling)

        def examples_of(split: str) -> dict[str, Any]:
            limit = spec.max_train_samples if split == "train" else spec.max_eval_samples
            used[split] = raw[split].take(subsample(len(raw[split]), limit, spec.seed))
            return self.examples(used[split], labels, split)

        examples = {"train": examples_of("train")}
        self.check_labels(train, labels)  # after the rows: a wrong field is the first thing to report
        for split in ("validation", "test"):
            if split in raw and self.has_labels(raw[split]):
                examples[split] = examples_of(split)
        if "validation" not in examples:  # it selects the trials: hidden labels there are an error
            validation = raw["validation"]
            validation.field_name(self.fields["label"])  # a missing field: name it and the fields found
            raise ValueError(f"{validation.origin}: expected labels in the validation split, "
                             f"found only hidden ones (null or -1)")
        if "test" in raw and "test" not in examples:
            notes.append(f"{self.name}: the test split has no labels (hidden, as in GLUE); test = None")
        warnings = self.input_warnings({split: used[split] for split in examples})
        for warning in warnings:
            log.warning(warning)
        return dataclasses.replace(self.featurize(examples, labels, spec, tuple(notes)), warnings=warnings)

    def inputs(self, raw: RawSplit) -> list[tuple[str, ...]] | None:
        """Each row's input text(s), for the checks of `input_warnings`; None where inputs are not text."""
        return None

    def input_warnings(self, splits: dict[str, RawSplit]) -> list[str]:
        """One line per split whose rows would mislead a comparison: inputs also in train (leakage: identical
        input text is enough), or a split whose every text is empty."""
        rows = {split: self.inputs(raw) for split, raw in splits.items()}
        warnings = []
        seen = set(rows["train"] or ())
        for split in ("validation", "test"):
            shared = [row for row in rows.get(split) or () if row in seen]
            if shared:
                example = excerpt(shared[0][0] if len(shared[0]) == 1 else shared[0])
                n = len(splits[split])
                warnings.append(f"{self.name}: {len(shared)} of {n} {split} rows ({len(shared) / n:.1%}) "
                                f"have an input that is also in train (e.g. {example}): their scores "
                                "reward memorising the training rows")
        for split, texts in rows.items():
            if texts and not any("".join(row).strip() for row in texts):
                warnings.append(f"{self.name}: every text of the {split} split is empty ({len(texts)} rows): "
                                "its scores cannot measure reading")
        return warnings

    def label_titles(self, data_dir: Path | None) -> dict[str, str]:
        """Readable names of the label ids where the data has them (eurlex's EUROVOC concept names), shown
        next to an id wherever a label is printed; {} where the labels are their own names."""
        return {}

    def summary(self, data: PreparedData) -> str | None:
        """One line saying what `data` is (eurlex: which label set), logged by `prepare` whenever the data is
        built or read; None where the data needs no such line."""
        return None

    def fit_labels(self, train: RawSplit) -> LabelMap:
        name = train.field_name(self.fields["label"])
        return LabelMap.fit(self.label_values(train), train.class_names.get(name), train.origin)

    def check_labels(self, train: RawSplit, labels: LabelMap) -> None:
        """Refuse training labels a classifier cannot learn from, and a metric the labels do not support."""
        classes = {v for v in self.label_values(train) if v is not None}
        if len(classes) < 2:
            raise ValueError(f"{train.origin}: expected at least 2 classes in the train split, found only "
                             f"{', '.join(map(excerpt, classes))} (all {len(train)} rows): nothing to learn, "
                             f"and a validation split of that class would score 1.0")
        if self.kind == "multiclass" and "f1" in self.metrics and len(labels) != 2:
            shown = ", ".join(clip(n, 40) for n in labels.names[:5]) + (", ..." if len(labels) > 5 else "")
            raise ValueError(f"{self.name}: metric 'f1' is the F1 of label id 1 of a 2-class task: "
                             f"expected 2 classes, got {len(labels)} ({shown}); use macro_f1 or micro_f1")

    def has_labels(self, raw: RawSplit) -> bool:
        if not raw.has(self.fields["label"]):  # e.g. a test file without labels
            return False
        return any(v is not None and v != -1 for v in raw.field(self.fields["label"]))  # -1: hidden (GLUE)

    def label_ids(self, raw: RawSplit, labels: LabelMap, split: str) -> list[int]:
        """The id of each row's single label (multi-class text and images)."""
        return [labels.id_of(v, split, raw.where(i)) for i, v in enumerate(raw.field(self.fields["label"]))]

    def label_values(self, raw: RawSplit) -> list[Any]:
        return raw.field(self.fields["label"])

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        raise NotImplementedError

    def featurize(self, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                  notes: tuple[str, ...]) -> PreparedData:
        raise NotImplementedError

    def package(self, splits: dict[str, Split], labels: LabelMap, spec: DataSettings, info: dict[str, Any],
                notes: tuple[str, ...]) -> PreparedData:
        for split in splits.values():
            split.label_names = labels.names
        return PreparedData(self.name, self.kind, spec, splits["train"], splits["validation"],
                            splits.get("test"), labels.names, info, notes, dict(self.options))

    # -- evaluation -----------------------------------------------------------------------------------
    def predict(self, logits: Tensor) -> Tensor:
        """Argmax over the last dim: (B, C) -> (B,), (B, T, C) -> (B, T)."""
        return logits.argmax(dim=-1)

    def score(self, preds: list[Tensor], split: Split) -> dict[str, float]:
        """Multi-class scoring; token and multi-label families override it."""
        y_pred = stack_preds(preds, split).long()
        y_true = split.columns["labels"].long()
        return {m: metrics.MULTICLASS[m](y_true, y_pred) for m in self.metrics}


def stack_preds(preds: list[Tensor], split: Split) -> Tensor:
    """Concatenate per-batch predictions and check they cover the split exactly."""
    out = torch.cat([p.detach().cpu() for p in preds]) if preds else torch.empty(0)
    if len(out) != len(split):
        raise ValueError(f"score: expected predictions for {len(split)} rows (the whole split, in order), "
                         f"got {len(out)}")
    return out
