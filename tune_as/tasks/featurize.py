"""Tokenization into compact tensors and frozen-encoder features (`freeze`), with progress display."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from . import backbones
from .data import DataSettings, PreparedData, Ragged, Split

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 1024  # rows per tokenizer call: big enough for the Rust batch path, small enough to show progress
ENCODE_BATCH = 128


def track(items: Sequence[T], description: str) -> Iterator[T]:
    """Yield `items` under a progress bar (stderr) and log the elapsed time."""
    from rich.console import Console
    from rich.progress import Progress

    start = time.perf_counter()
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(description, total=len(items))
        for item in items:
            yield item
            bar.advance(task)
    log.info("%s: %.1f s", description, time.perf_counter() - start)


def _pad(rows: list[list[int]], value: int, dtype: torch.dtype) -> Tensor:
    width = max((len(r) for r in rows), default=1)
    out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _columns(tokenizer: Any, ids: list[list[int]], types: list[list[int]]) -> tuple[dict[str, Tensor], Tensor]:
    columns = {"input_ids": _pad(ids, tokenizer.pad_token_id, torch.int32)}
    if types:
        columns["token_type_ids"] = _pad(types, 0, torch.int8)
    return columns, torch.tensor([len(r) for r in ids], dtype=torch.long)


def text_split(tokenizer: Any, texts: list[str], pairs: list[str] | None, labels: Tensor,
               max_length: int, description: str) -> Split:
    """Sentence (pair) classification inputs; labels (N,) int64 or (N, C) float multi-hot."""
    ids: list[list[int]] = []
    types: list[list[int]] = []
    for a in track(range(0, len(texts), CHUNK), description):
        enc = tokenizer(texts[a:a + CHUNK], pairs[a:a + CHUNK] if pairs is not None else None,
                        truncation=True, max_length=max_length)
        ids += enc["input_ids"]
        types += enc.get("token_type_ids", [])
    columns, lengths = _columns(tokenizer, ids, types)
    columns["labels"] = labels
    return Split(columns, lengths=lengths, seq_columns=("input_ids", "token_type_ids"))


def token_split(tokenizer: Any, words: list[list[str]], word_labels: list[list[int]], max_length: int,
                description: str, meta: dict[str, list[Any]]) -> Split:
    """Word-level labels moved to sub-tokens: the first sub-token of a word carries its label, the rest
    and the special tokens get -100. meta["word_index"][i] lists the words that kept a labelled position
    (a word can lose it to truncation, or produce no token at all), in position order."""
    ids: list[list[int]] = []
    types: list[list[int]] = []
    label_rows: list[list[int]] = []
    word_index: list[list[int]] = []
    for a in track(range(0, len(words), CHUNK), description):
        enc = tokenizer(words[a:a + CHUNK], is_split_into_words=True, truncation=True, max_length=max_length)
        ids += enc["input_ids"]
        types += enc.get("token_type_ids", [])
        for i in range(len(enc["input_ids"])):
            row_labels, kept, previous = [], [], None
            for w in enc.word_ids(i):
                first = w is not None and w != previous
                row_labels.append(word_labels[a + i][w] if first else -100)
                if first:
                    kept.append(w)
                previous = w
            label_rows.append(row_labels)
            word_index.append(kept)
    columns, lengths = _columns(tokenizer, ids, types)
    columns["labels"] = _pad(label_rows, -100, torch.int32)
    meta = dict(meta, word_index=word_index)
    return Split(columns, lengths=lengths, seq_columns=("input_ids", "token_type_ids", "labels"), meta=meta)


@torch.inference_mode()
def encode_split(encoder: nn.Module, split: Split, token: bool, description: str) -> Split:
    """Frozen features: mean-pooled last hidden states (N, H) for sentences (the pooling all-MiniLM was
    trained with), or the first sub-token state of every labelled word, stored ragged, for token tasks."""
    assert split.lengths is not None
    encoder.eval()
    n = len(split)
    order = torch.argsort(split.lengths, descending=True)  # similar lengths per batch: little padding
    batches = [order[a:a + ENCODE_BATCH] for a in range(0, n, ENCODE_BATCH)]
    pooled: Tensor | None = None
    per_row: list[Tensor] = [torch.empty(0)] * n
    for idx in track(batches, description):
        batch = split.batch(idx)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        hidden = encoder(**inputs).last_hidden_state  # (B, T, H)
        if token:
            keep = batch["labels"] != -100  # (B, T)
            for row, i in enumerate(idx.tolist()):
                per_row[i] = hidden[row][keep[row]].half()
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, H)
            if pooled is None:
                pooled = torch.zeros(n, hidden.shape[-1], dtype=torch.float16)
            pooled[idx] = mean.half()
    if token:
        labels = split.columns["labels"].long()
        flat_labels = labels[labels != -100]  # row-major order = per_row order
        offsets = torch.zeros(n + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(torch.tensor([len(r) for r in per_row]), 0)
        return Split({}, ragged=Ragged(torch.cat(per_row), flat_labels, offsets), meta=split.meta,
                     label_names=split.label_names)
    assert pooled is not None
    return Split({"features": pooled, "labels": split.columns["labels"]}, meta=split.meta,
                 label_names=split.label_names)


def freeze(data: PreparedData, spec: DataSettings) -> PreparedData:
    """Encode every split of tokenized `data` once with its backbone (no grad) and keep only the features."""
    encoder = backbones.load_backbone(data.model_info, spec.seed)
    token = data.kind == "token"
    splits: dict[str, Any] = {}
    for name in ("train", "validation", "test"):
        split = getattr(data, name)
        if split is not None:
            splits[name] = encode_split(encoder, split, token, f"{spec.task}: encoding {name} ({spec.backbone})")
    info = dict(data.model_info, encoder="frozen", feature_dim=int(data.model_info["hidden_size"]))
    return dataclasses.replace(data, model_info=info, **splits)
