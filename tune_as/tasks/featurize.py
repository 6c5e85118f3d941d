"""Tokenization into compact tensors and frozen-encoder features (`freeze`), with progress display."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from . import backbones
from .data import DataSettings, PreparedData, Ragged, Split

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 1024  # rows per tokenizer call: big enough for the Rust batch path, small enough to show progress
ENCODE_BATCH = 128


PIPE_EVERY_S = 30.0  # without a terminal: a progress line at most this often (and at the end)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min {secs:02d} s"


def track(items: Sequence[T], description: str, sizes: Sequence[int] | None = None, unit: str = "docs",
          clock: Callable[[], float] = time.perf_counter) -> Iterator[T]:
    """Yield `items`, showing how far the work is in `unit`s (each item counts its `sizes` entry, default 1):
    done of total, rate and time left. A terminal gets a bar (stderr, redrawn); otherwise a line on stderr at most
    every PIPE_EVERY_S seconds and at the end, so a log or CI shows progress too. The total time is logged."""
    import rich.progress as rp
    from rich.console import Console
    from rich.text import Text

    class Rate(rp.ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed or 0:,.0f} {unit}/s")

    weights = list(sizes) if sizes is not None else [1] * len(items)
    total, done, start = sum(weights), 0, clock()
    console = Console(stderr=True)
    if console.is_terminal:
        columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(), Rate(),
                   rp.TimeRemainingColumn())
        with rp.Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            for item, weight in zip(items, weights, strict=True):
                yield item
                bar.advance(task, weight)
    else:
        last = start
        for item, weight in zip(items, weights, strict=True):
            yield item
            done += weight
            now = clock()
            if now - last >= PIPE_EVERY_S and done < total:
                last = now
                rate = done / max(now - start, 1e-9)
                print(f"{description}: {done:,}/{total:,} {unit}, {rate:,.0f} {unit}/s, "
                      f"{_clock((total - done) / max(rate, 1e-9))} left", file=sys.stderr, flush=True)
    elapsed = clock() - start
    if not console.is_terminal and elapsed >= PIPE_EVERY_S:
        print(f"{description}: {total:,} {unit} in {_clock(elapsed)}", file=sys.stderr, flush=True)
    log.info("%s: %.1f s", description, elapsed)


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
               max_length: int, description: str) -> tuple[Split, str | None]:
    """Sentence (pair) classification inputs; labels (N,) int64 or (N, C) float multi-hot. With the split, a
    one-line note of the texts cut to `max_length` tokens (how many, and how many tokens each lost), or None.
    (Text pairs are cut too, but not counted: a fast tokenizer returns no overflow for pairs.)"""
    ids: list[list[int]] = []
    types: list[list[int]] = []
    lost = [0] * len(texts)  # tokens each single text lost to truncation
    specials = tokenizer.num_special_tokens_to_add(pair=False)
    starts = range(0, len(texts), CHUNK)
    for a in track(starts, description, [min(CHUNK, len(texts) - a) for a in starts]):
        enc = tokenizer(texts[a:a + CHUNK], pairs[a:a + CHUNK] if pairs is not None else None,
                        truncation=True, max_length=max_length, return_overflowing_tokens=pairs is None)
        rows = enc.get("overflow_to_sample_mapping") or list(range(len(enc["input_ids"])))
        for k, row in enumerate(rows):
            if k and rows[k - 1] == row:  # a continuation of the text: what truncation cut off
                lost[a + row] += len(enc["input_ids"][k]) - specials
                continue
            ids.append(enc["input_ids"][k])
            if "token_type_ids" in enc:
                types.append(enc["token_type_ids"][k])
    columns, lengths = _columns(tokenizer, ids, types)
    columns["labels"] = labels
    cut = sorted(n for n in lost if n)
    note = None
    if cut:
        note = (f"{description.split(':')[0]}: {len(cut):,} of {len(texts):,} texts were cut to max_length "
                f"{max_length} tokens (tokens lost per cut text: median {cut[len(cut) // 2]:,}, most {cut[-1]:,})")
    return Split(columns, lengths=lengths, seq_columns=("input_ids", "token_type_ids")), note


def token_split(tokenizer: Any, words: list[list[str]], word_labels: list[list[int]], max_length: int,
                description: str, meta: dict[str, list[Any]]) -> Split:
    """Word-level labels moved to sub-tokens: the first sub-token of a word carries its label, the rest
    and the special tokens get -100. meta["word_index"][i] lists the words that kept a labelled position
    (a word can lose it to truncation, or produce no token at all), in position order."""
    ids: list[list[int]] = []
    types: list[list[int]] = []
    label_rows: list[list[int]] = []
    word_index: list[list[int]] = []
    starts = range(0, len(words), CHUNK)
    for a in track(starts, description, [min(CHUNK, len(words) - a) for a in starts], unit="sentences"):
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
def encode_split(encoder: nn.Module, split: Split, token: bool, description: str, bf16: bool = False) -> Split:
    """Frozen features: mean-pooled last hidden states (N, H) for sentences (the pooling all-MiniLM was
    trained with), or the first sub-token state of every labelled word, stored ragged, for token tasks. `bf16`:
    the encoder runs under bf16 autocast (features still pooled and stored as fp16)."""
    assert split.lengths is not None
    encoder.eval()
    n = len(split)
    order = torch.argsort(split.lengths, descending=True)  # similar lengths per batch: little padding
    batches = [order[a:a + ENCODE_BATCH] for a in range(0, n, ENCODE_BATCH)]
    pooled: Tensor | None = None
    per_row: list[Tensor] = [torch.empty(0)] * n
    for idx in track(batches, description, [len(b) for b in batches]):
        batch = split.batch(idx)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        with torch.autocast(next(encoder.parameters()).device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = encoder(**inputs).last_hidden_state.float()  # (B, T, H)
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
            splits[name] = encode_split(encoder, split, token, f"{spec.task}: encoding {name} ({spec.backbone})",
                                        bf16=spec.encode_precision == "bf16")
    info = dict(data.model_info, encoder="frozen", feature_dim=int(data.model_info["hidden_size"]))
    return dataclasses.replace(data, model_info=info, **splits)
