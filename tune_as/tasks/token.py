"""Token classification: conll2003 (IOB2 NER) and sighan2015 (spelling correction as per-character
classification over a character vocabulary cut to the training data)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..errors import excerpt
from . import metrics
from .backbones import load_tokenizer
from .base import Task, TaskDefaults
from .data import DataSettings, PreparedData, Split
from .featurize import token_split
from .labels import LabelMap
from .sources import HubSource, RawSplit

UNK = "[UNK]"  # sighan class 0: an evaluation target character never seen in training (never a prediction)


def word_lists(raw: RawSplit, candidates: tuple[str, ...]) -> list[list[str]]:
    rows = raw.field(candidates)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not all(isinstance(w, str) for w in row):
            raise ValueError(f"{raw.where(i)}: expected field {raw.field_name(candidates)!r} to be a list of "
                             f"strings, got {excerpt(row)}")
    return rows


def predicted_words(preds: list[Tensor], split: Split) -> Iterator[tuple[int, dict[int, int]]]:
    """(row, {word index: predicted label id}) for every row, from per-batch (B, T) predictions whose
    labelled positions (labels != -100) line up with meta["word_index"]."""
    start = 0
    for pred in preds:
        rows = torch.arange(start, start + len(pred))
        gold = split.labels(rows)  # (B, T') trimmed exactly as the batch was
        pred = pred.detach().cpu()[:, : gold.shape[1]]
        if pred.shape[1] < gold.shape[1]:
            raise ValueError(f"score: predictions of width {pred.shape[1]} for rows {start}.. are narrower "
                             f"than the batch's labels ({gold.shape[1]})")
        for b, row in enumerate(rows.tolist()):
            ids = pred[b][gold[b] != -100].tolist()
            yield row, dict(zip(split.meta["word_index"][row], ids, strict=True))
        start += len(pred)
    if start != len(split):
        raise ValueError(f"score: expected predictions for {len(split)} rows (the whole split, in order), "
                         f"got {start}")


@dataclass
class TokenTagging(Task):
    """Word-level tags; the first sub-token of each word carries its tag. Words lost to truncation are
    scored as "O" (a missed entity, never a free pass)."""

    fields: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"words": ("tokens", "words"), "label": ("tags", "ner_tags")})
    family = "token"
    char_level = False

    def label_values(self, raw: RawSplit) -> list[Any]:
        return [tag for row in raw.field(self.fields["label"]) for tag in row]

    def inputs(self, raw: RawSplit) -> list[tuple[str, ...]]:
        return [(" ".join(words),) for words in word_lists(raw, self.fields["words"])]

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        words, tags = word_lists(raw, self.fields["words"]), word_lists(raw, self.fields["label"])
        for i, (w, t) in enumerate(zip(words, tags, strict=True)):
            if len(w) != len(t):
                raise ValueError(f"{raw.where(i)}: expected one tag per word, "
                                 f"got {len(w)} words and {len(t)} tags")
        ids = [[labels.id_of(tag, split, raw.where(i)) for tag in t] for i, t in enumerate(tags)]
        return {"words": words, "labels": ids, "meta": {"gold": tags}}

    def featurize(self, examples: dict[str, dict[str, Any]], labels: LabelMap, spec: DataSettings,
                  notes: tuple[str, ...]) -> PreparedData:
        corpus = [" ".join(words) for words in examples["train"]["words"]]
        tokenizer, info = load_tokenizer(spec.backbone, corpus, self.char_level)
        splits = {name: token_split(tokenizer, ex["words"], ex["labels"], spec.max_length,
                                    f"{self.name}: tokenizing {name}", ex["meta"])
                  for name, ex in examples.items()}
        return self.package(splits, labels, spec, dict(info, encoder="finetune"), notes)

    def score(self, preds: list[Tensor], split: Split) -> dict[str, float]:
        names, gold = split.label_names, split.meta["gold"]
        predicted = [["O"] * len(g) for g in gold]
        for row, by_word in predicted_words(preds, split):
            for w, label in by_word.items():
                predicted[row][w] = names[label]
        table = {"f1": metrics.entity_f1, "accuracy": metrics.token_accuracy}
        return {m: table[m](gold, predicted) for m in self.metrics}


@dataclass
class SpellingCorrection(TokenTagging):
    """Input: the source characters; label of each: the target character (id in the training character
    vocabulary). Scored with SpellGCN's sentence-level correction F1 (metrics.csc_sentence_correction);
    a predicted [UNK] or a character with no position (truncated) keeps the source character."""

    fields: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"source": ("source", "original_text"), "label": ("target", "correct_text")})
    char_level = True

    def fit_labels(self, train: RawSplit) -> LabelMap:
        chars = {c for text in train.field(self.fields["source"]) + train.field(self.fields["label"])
                 for c in text}
        return LabelMap([UNK, *sorted(chars)])

    def inputs(self, raw: RawSplit) -> list[tuple[str, ...]]:
        return [(source,) for source in raw.field(self.fields["source"])]

    def examples(self, raw: RawSplit, labels: LabelMap, split: str) -> dict[str, Any]:
        sources, targets = raw.field(self.fields["source"]), raw.field(self.fields["label"])
        for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
            if not (isinstance(s, str) and isinstance(t, str)) or len(s) != len(t):
                raise ValueError(f"{raw.where(i)}: expected source and target strings of equal length, got "
                                 f"{excerpt(s, 60)} / {excerpt(t, 60)}")
        ids = [[labels.ids.get(c, 0) for c in t] for t in targets]
        return {"words": [list(s) for s in sources], "labels": ids,
                "meta": {"source": sources, "target": targets}}

    def score(self, preds: list[Tensor], split: Split) -> dict[str, float]:
        names, sources = split.label_names, split.meta["source"]
        predicted = [list(s) for s in sources]
        for row, by_word in predicted_words(preds, split):
            for w, label in by_word.items():
                if label != 0:
                    predicted[row][w] = names[label]
        result = metrics.csc_sentence_correction(sources, split.meta["target"],
                                                 ["".join(p) for p in predicted])
        return {m: result[m] for m in self.metrics}


TOKEN_TASKS = {
    "conll2003": TokenTagging("conll2003", "token", ("f1",),
                              TaskDefaults(20, 32, 2e-5, 128, "bert-base-cased"),
                              HubSource("eriktks/conll2003")),
    # Paper: Chinese RoBERTa-wwm-ext; train = SIGHAN13-15 (+ Wang271K on the hub), test = SIGHAN15 test.
    "sighan2015": SpellingCorrection(
        "sighan2015", "token", ("f1",), TaskDefaults(15, 128, 5e-5, 160, "hfl/chinese-roberta-wwm-ext"),
        HubSource("shibing624/CSC")),
}
