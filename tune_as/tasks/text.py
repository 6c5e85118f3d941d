"""Sentence (pair) classification: sst5, clinc_oos, and the family GLUE and `jsonl` multi-class reuse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import excerpt
from .backbones import load_tokenizer
from .base import DEFAULT_STEMS, Task, TaskDefaults
from .data import DataSettings, PreparedData
from .featurize import text_split
from .labels import LabelMap
from .sources import HubSource, RawSplit

TEXT_FIELDS = {"text": ("text",), "label": ("label",)}


def strings(raw: RawSplit, candidates: tuple[str, ...]) -> list[str]:
    values = raw.field(candidates)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"{raw.where(i)}: expected field {raw.field_name(candidates)!r} to be a string, "
                             f"got {type(value).__name__} ({excerpt(value, 60)})")
    return values


def text_inputs(task: Task, raw: RawSplit) -> dict[str, Any]:
    pair = task.fields.get("text_pair")
    return {"texts": strings(raw, task.fields["text"]), "pairs": strings(raw, pair) if pair else None}


def text_rows(task: Task, raw: RawSplit) -> list[tuple[str, ...]]:
    """Each row's text, or (text, pair): `Task.inputs` of the families that classify texts."""
    found = text_inputs(task, raw)
    return (list(zip(found["texts"], found["pairs"], strict=True)) if found["pairs"]
            else [(t,) for t in found["texts"]])


def featurize_text(task: Task, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                   notes: tuple[str, ...]) -> PreparedData:
    """Tokenize every split with the backbone's tokenizer (`tiny`: trained on the training texts)."""
    train = examples["train"]
    corpus = train["texts"] + (train["pairs"] or [])
    tokenizer, info = load_tokenizer(spec.backbone, corpus, char_level=False)
    splits, cut = {}, []
    for name, ex in examples.items():
        splits[name], note = text_split(tokenizer, ex["texts"], ex["pairs"], ex["labels"], spec.max_length,
                                        f"{task.name} {name}: tokenizing")
        if note:
            cut.append(note)
    return task.package(splits, labels, spec, dict(info, encoder="finetune", pooling="mean"), (*notes, *cut))


@dataclass
class TextClassification(Task):
    """Single-label classification of a text or a text pair; labels are mapped to ids from train."""

    fields: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(TEXT_FIELDS))
    family = "text"

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        return dict(text_inputs(self, raw),
                    labels=torch.tensor(self.label_ids(raw, labels, split), dtype=torch.long))

    def inputs(self, raw: RawSplit) -> list[tuple[str, ...]]:
        return text_rows(self, raw)

    def featurize(self, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                  notes: tuple[str, ...]) -> PreparedData:
        return featurize_text(self, examples, labels, spec, notes)


def _paper(epochs: int, batch_size: int, lr: float, max_length: int = 128) -> TaskDefaults:
    return TaskDefaults(epochs, batch_size, lr, max_length, "bert-base-cased")


TEXT_TASKS = {
    "sst5": TextClassification("sst5", "multiclass", ("accuracy",), _paper(7, 16, 2e-5),
                               HubSource("SetFit/sst5")),
    # The paper's 15250 training rows are the "OOS+" variant (train_plus.jsonl.gz locally, config "plus").
    "clinc_oos": TextClassification(
        "clinc_oos", "multiclass", ("accuracy",), _paper(10, 32, 2e-5, 64), HubSource("clinc_oos", "plus"),
        stems=dict(DEFAULT_STEMS, train=("train_plus", "train")),
        fields={"text": ("text",), "label": ("label", "intent")},
    ),
}
