"""Tokenization into compact tensors and frozen-encoder features (`freeze`), with progress display."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from . import backbones, chunks
from .data import DataSettings, PreparedData, Ragged, Split

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 1024  # rows per tokenizer call: big enough for the Rust batch path, small enough to show progress
ENCODE_BATCH = 128
# rows per resumable chunk (whole batches): an interruption loses at most this much work, about 80 s of MiniLM
# at 512 tokens on 2 cores; a chunk file of 1024 x 384 fp16 features is 0.8 MB
ENCODE_CHUNK = 1024


PIPE_EVERY_S = 30.0  # without a terminal: a progress line at most this often (and at the end)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min {secs:02d} s"


def track(items: Sequence[T], description: str, sizes: Sequence[int] | None = None, unit: str = "docs",
          clock: Callable[[], float] = time.perf_counter, done: int = 0) -> Iterator[T]:
    """Yield `items`, showing how far the work is in `unit`s (each item counts its `sizes` entry, default 1):
    done of total, rate and time left. A terminal gets a bar (stderr, redrawn); otherwise a line on stderr at
    most every PIPE_EVERY_S seconds and at the end, so a log or CI shows progress too. The total time is
    logged. `done`: units finished before (a resumed encode): counted as done, but not in the rate."""
    import rich.progress as rp
    from rich.console import Console
    from rich.text import Text

    class Rate(rp.ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed or 0:,.0f} {unit}/s")

    weights = list(sizes) if sizes is not None else [1] * len(items)
    before = done
    total, start = sum(weights) + before, clock()
    console = Console(stderr=True)
    if console.is_terminal:
        columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(), Rate(),
                   rp.TimeRemainingColumn())
        with rp.Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(description, total=total, completed=before)
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
                rate = (done - before) / max(now - start, 1e-9)
                print(f"{description}: {done:,}/{total:,} {unit}, {rate:,.0f} {unit}/s, "
                      f"{_clock((total - done) / max(rate, 1e-9))} left", file=sys.stderr, flush=True)
    elapsed = clock() - start
    if not console.is_terminal and elapsed >= PIPE_EVERY_S:
        now_done = f"{total:,} {unit}, {total - before:,} of them" if before else f"{total:,} {unit}"
        earlier = f" ({before:,} done before)" if before else ""
        print(f"{description}: {now_done} in {_clock(elapsed)}{earlier}", file=sys.stderr, flush=True)
    log.info("%s: %.1f s", description, elapsed)


def _pad(rows: list[list[int]], value: int, dtype: torch.dtype) -> Tensor:
    width = max((len(r) for r in rows), default=1)
    out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _columns(tokenizer: Any, ids: list[list[int]],
             types: list[list[int]]) -> tuple[dict[str, Tensor], Tensor]:
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
                f"{max_length} tokens (tokens lost per cut text: median {cut[len(cut) // 2]:,}, "
                f"most {cut[-1]:,})")
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


def _encode_batch(encoder: nn.Module, split: Split, idx: Tensor, token: bool,
                  bf16: bool) -> tuple[Tensor, Tensor]:
    """(features, counts) of rows `idx`: a mean-pooled (B, H) row each, or the (sum(counts), H) states of the
    labelled words of token rows, float16."""
    batch = split.batch(idx)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    with torch.autocast(next(encoder.parameters()).device.type, dtype=torch.bfloat16, enabled=bf16):
        hidden = encoder(**inputs).last_hidden_state.float()  # (B, T, H)
    if token:
        keep = batch["labels"] != -100  # (B, T)
        return hidden[keep].half(), keep.sum(1)  # row-major: each row's words in position order
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, H)
    return mean.half(), torch.ones(len(idx), dtype=torch.long)


@torch.inference_mode()
def encode_split(encoder: nn.Module, split: Split, token: bool, description: str, bf16: bool = False,
                 partial: chunks.Partial | None = None) -> Split:
    """Frozen features: mean-pooled last hidden states (N, H) for sentences (the pooling all-MiniLM was
    trained with), or the first sub-token state of every labelled word, stored ragged, for token tasks.
    `bf16`: the encoder runs under bf16 autocast (features still pooled and stored as fp16).

    Rows are sorted by length (little padding per batch) and encoded in chunks of ENCODE_CHUNK rows, whole
    batches of ENCODE_BATCH. `partial`: where each finished chunk is written and, on a later call, found
    again, so an interrupted encode resumes; the batches are the same either way, so are the features,
    bit for bit."""
    assert split.lengths is not None and ENCODE_CHUNK % ENCODE_BATCH == 0
    encoder.eval()
    n = len(split)
    order = torch.argsort(split.lengths, descending=True, stable=True)  # similar lengths per batch
    words = (split.columns["labels"] != -100).sum(1) if token else torch.ones(n, dtype=torch.long)
    plan = [(rows, words[rows]) for rows in order.split(ENCODE_CHUNK)]  # (rows, counts) of each chunk
    done = partial.load(plan) if partial is not None else {}
    resumed = sum(len(plan[i][0]) for i in done)
    if resumed:
        assert partial is not None
        log.warning("%s: resuming, %s of %s rows already encoded in %s", description, f"{resumed:,}",
                    f"{n:,}", partial.folder)
    todo = [(i, idx) for i, (rows, _) in enumerate(plan) if i not in done for idx in rows.split(ENCODE_BATCH)]
    pieces: list[tuple[Tensor, Tensor]] = []
    for i, idx in track(todo, description, [len(idx) for _, idx in todo], done=resumed):
        pieces.append(_encode_batch(encoder, split, idx, token, bf16))
        if sum(len(c) for _, c in pieces) == len(plan[i][0]):  # the chunk's last batch
            done[i] = chunks.Chunk(plan[i][0], torch.cat([c for _, c in pieces]),
                                   torch.cat([f for f, _ in pieces]))
            if partial is not None:
                partial.save(i, done[i])
            pieces = []
    rows = torch.cat([done[i].rows for i in range(len(plan))])
    counts = torch.cat([done[i].counts for i in range(len(plan))])
    features = torch.cat([done[i].features for i in range(len(plan))])  # in encode order
    if token:
        per_row = dict(zip(rows.tolist(), features.split(counts.tolist()), strict=True))
        labels = split.columns["labels"].long()
        flat_labels = labels[labels != -100]  # row-major order = row order
        offsets = torch.zeros(n + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(words, 0)
        return Split({}, ragged=Ragged(torch.cat([per_row[i] for i in range(n)]), flat_labels, offsets),
                     meta=split.meta, label_names=split.label_names)
    pooled = torch.empty_like(features)
    pooled[rows] = features
    return Split({"features": pooled, "labels": split.columns["labels"]}, meta=split.meta,
                 label_names=split.label_names)


def freeze(data: PreparedData, spec: DataSettings, partial: Path | None = None) -> PreparedData:
    """Encode every split of tokenized `data` once with its backbone (no grad) and keep only the features.
    `partial`: the folder where finished chunks are kept until the caller has saved the result (`chunks`)."""
    encoder = backbones.load_backbone(data.model_info, spec.seed)
    token = data.kind == "token"
    hidden = int(data.model_info["hidden_size"])
    splits: dict[str, Any] = {}
    for name in ("train", "validation", "test"):
        split = getattr(data, name)
        if split is not None:
            store = None
            if partial is not None:
                key = chunks.ChunkKey(partial.name, spec.backbone, spec.max_length, spec.encode_precision,
                                      name, len(split), ENCODE_CHUNK, ENCODE_BATCH, hidden)
                store = chunks.Partial(partial, key)
            splits[name] = encode_split(encoder, split, token,
                                        f"{spec.task}: encoding {name} ({spec.backbone})",
                                        bf16=spec.encode_precision == "bf16", partial=store)
    info = dict(data.model_info, encoder="frozen", feature_dim=hidden)
    return dataclasses.replace(data, model_info=info, **splits)
