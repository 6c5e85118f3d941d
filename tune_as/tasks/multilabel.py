"""Multi-label text classification: eurlex (EURLEX57K or LexGLUE), wos46985 (Web of Science, parent + child
labels) and goemotions (GoEmotions, 28 emotions).

Prediction is every class with logit > 0 (the AS-Softmax paper's rule for Eq. 14 and its variants, and
sigmoid > 0.5 for bce), except on wos46985 (the two highest logits). The trial predicts
`task.predict(loss.class_scores(logits))`; every multi-label loss's class scores are its logits.
docs/losses.md gives the rule per loss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import excerpt
from . import metrics
from .base import Task, TaskDefaults, stack_preds
from .data import DataSettings, PreparedData, Split
from .labels import LabelMap
from .sources import HubSource, RawSplit
from .text import featurize_text, text_inputs, text_rows


def multi_hot(rows: list[list[int]], n: int) -> Tensor:
    out = torch.zeros(len(rows), n)
    for i, ids in enumerate(rows):
        out[i, ids] = 1.0
    return out  # (N, C) float


@dataclass
class MultiLabelText(Task):
    """Each row has a list of labels. Prediction: every class with logit > 0 (for bce: probability > 0.5); a
    row with no positive logit predicts no label (the paper's rule: no fallback to the highest logit)."""

    fields: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"text": ("text",), "label": ("labels",)})
    family = "multilabel"

    def label_lists(self, raw: RawSplit) -> list[list[Any]]:
        rows = raw.field(self.fields["label"])
        for i, row in enumerate(rows):
            if not isinstance(row, list):
                raise ValueError(f"{raw.where(i)}: expected field {raw.field_name(self.fields['label'])!r} "
                                 f"to be a list of labels (multi-label task), got {excerpt(row, 60)}")
        return rows

    def label_values(self, raw: RawSplit) -> list[Any]:
        return [v for row in self.label_lists(raw) for v in row]

    def has_labels(self, raw: RawSplit) -> bool:
        return raw.has(self.fields["label"])

    def check_labels(self, train: RawSplit, labels: LabelMap) -> None:
        label_sets = {tuple(sorted(map(str, row))) for row in self.label_lists(train)}
        if len(label_sets) < 2:
            shown = excerpt([v + labels.title(v) for v in label_sets.pop()])
            raise ValueError(f"{train.origin}: expected rows with different labels in the train split, found "
                             f"{shown} on all {len(train)} rows: nothing to learn, and a "
                             f"validation split like it would score 1.0")

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        rows = self.label_lists(raw)
        if split == "validation" and not any(rows):  # it selects the trials: an F1 of nothing selects nothing
            raise ValueError(f"{raw.origin}: expected labels in the validation split "
                             f"(a non-empty list on some row), got an empty list on all {len(raw)} rows")
        ids = [[labels.id_of(v, split, raw.where(i)) for v in row] for i, row in enumerate(rows)]
        return dict(text_inputs(self, raw), labels=multi_hot(ids, len(labels)))

    def inputs(self, raw: RawSplit) -> list[tuple[str, ...]]:
        return text_rows(self, raw)

    def featurize(self, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                  notes: tuple[str, ...]) -> PreparedData:
        return featurize_text(self, examples, labels, spec, notes)

    def predict(self, logits: Tensor) -> Tensor:
        return logits > 0  # (B, C) bool; strict: a logit of exactly 0 (sigmoid 0.5) is not predicted

    def score(self, preds: list[Tensor], split: Split) -> dict[str, float]:
        y_pred, y_true = stack_preds(preds, split).bool(), split.columns["labels"].bool()
        return {m: metrics.MULTILABEL[m](y_true, y_pred) for m in self.metrics}


@dataclass
class WebOfScience(MultiLabelText):
    """WOS-46985 (HF `web_of_science`/WOS46985 schema: input_data, label, label_level_1, label_level_2).
    Outputs = the 7 parent domains + the 134 child areas (141), two positives per row; prediction = the two
    highest logits (the paper). The source has one split: test then validation are carved (6.4 : 1.6 : 2)."""

    fields: dict[str, tuple[str, ...]] = field(default_factory=lambda: {
        "text": ("input_data", "text"), "parent": ("label_level_1",), "label": ("label",)})

    def label_lists(self, raw: RawSplit) -> list[list[Any]]:
        parents, children = raw.field(self.fields["parent"]), raw.field(self.fields["label"])
        return [[f"parent/{p}", f"child/{c}"] for p, c in zip(parents, children, strict=True)]

    def fit_labels(self, train: RawSplit) -> LabelMap:
        def ordered(prefix: str, values: list[Any]) -> list[str]:
            return [f"{prefix}/{v}" for v in sorted(set(values), key=lambda v: (str(type(v)), v))]

        return LabelMap(ordered("parent", train.field(self.fields["parent"]))
                        + ordered("child", train.field(self.fields["label"])))

    def predict(self, logits: Tensor) -> Tensor:
        return metrics.top_k_multi_hot(logits, 2)


CONCEPT_NAMES = "labels.json"  # EURLEX57K's EUROVOC concept id -> English name, beside its splits


def concept_names(data_dir: Path | None) -> dict[str, str]:
    """EURLEX57K's concept names (`labels.json` in data_dir); {} where there is none (LexGLUE: the hub or its
    save_to_disk copy, whose ClassLabel names are the concept ids)."""
    path = data_dir / CONCEPT_NAMES if data_dir is not None else None
    if path is None or not path.is_file():
        return {}
    expected = f"{path}: expected a JSON object mapping EUROVOC concept ids to names"
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:  # no OSError escapes for a local file
        raise ValueError(f"{expected}, got a file it cannot read ({type(exc).__name__})") from None
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise ValueError(f"{expected}, got {excerpt(names)}")
    return names


@dataclass
class EurLex(MultiLabelText):
    """eurlex in either layout, told apart by `labels.json`: EURLEX57K (a folder of JSON Lines with the
    concept names in labels.json, as ../shared/data/eurlex; the labels are the EUROVOC descriptors present in
    train) or LexGLUE's eurlex (the hub, or its save_to_disk copy: the level-2 concepts as ClassLabel ids, no
    names)."""

    def label_titles(self, data_dir: Path | None) -> dict[str, str]:
        return concept_names(data_dir)

    def summary(self, data: PreparedData) -> str | None:
        """Which label set the model's outputs are, so no score is read as the other layout's."""
        outputs, data_dir = len(data.label_names), data.spec.data_dir
        names = concept_names(data_dir)
        if not names:
            source = self.hub if data_dir is None else data_dir
            return (f"{self.name}: LexGLUE eurlex, {outputs:,} level-2 EUROVOC concepts ({source}; "
                    "no concept names in the data)")
        per_label = data.train.columns["labels"].sum(0)  # (C,) training documents kept per concept
        present = int((per_label > 0).sum())
        top = per_label.argsort(descending=True, stable=True)[:3].tolist()
        shown = ", ".join(repr(names.get(data.label_names[i], data.label_names[i])) for i in top)
        kept = (f"; {present:,} of them in the {len(data.train):,} training documents kept"
                if present < outputs else "")
        return (f"{self.name}: EURLEX57K, {len(names):,} EUROVOC concepts "
                f"(labels present in train: {outputs:,}, the model's outputs{kept}; most frequent: {shown})")


MULTILABEL_TASKS = {
    "eurlex": EurLex("eurlex", "multilabel", ("micro_f1", "macro_f1"),
                             TaskDefaults(20, 16, 3e-5, 512, "bert-base-cased"),
                             HubSource("coastalcph/lex_glue", "eurlex")),
    "wos46985": WebOfScience("wos46985", "multilabel", ("micro_f1", "macro_f1"),
                             TaskDefaults(10, 12, 3e-5, 512, "bert-base-cased"),
                             HubSource("web_of_science", "WOS46985"),
                             carve=(("test", 0.2), ("validation", 0.2))),
    # Not in the AS-Softmax paper: the defaults are the GoEmotions authors' BERT baseline (Demszky et al.
    # 2020; google-research goemotions/bert_classifier.py: 4 epochs, batch 16, lr 5e-5, 50 word pieces, cased
    # BERT-base). 50 word pieces truncate 10 of the 43410 training texts (measured with MiniLM's WordPiece).
    # The "simplified" hub config is the same 43410/5426/5427 rows with `labels` as ClassLabel ids.
    "goemotions": MultiLabelText("goemotions", "multilabel", ("micro_f1", "macro_f1"),
                                 TaskDefaults(4, 16, 5e-5, 50, "bert-base-cased"),
                                 HubSource("google-research-datasets/go_emotions", "simplified"),
                                 shared_copy="goemotions"),
}
