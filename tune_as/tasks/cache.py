"""On-disk cache of prepared data, two levels: tokenized tensors (key without the encoder mode) and frozen
features (key with it). A frozen prepare reuses the tokenized level; a trial never tokenizes or encodes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .data import DataSpec, PreparedData

if TYPE_CHECKING:
    from .base import Task

log = logging.getLogger(__name__)
VERSION = 1  # bump when the layout of PreparedData changes: old entries are then ignored


def source_signature(data_dir: Path | None) -> list[tuple[str, int, int]]:
    """Files under data_dir with size and mtime: editing the data invalidates the cache."""
    if data_dir is None or not data_dir.is_dir():
        return []
    files = sorted(p for p in data_dir.rglob("*") if p.is_file())
    return [(str(p.relative_to(data_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def cache_key(task: Task, spec: DataSpec) -> str:
    payload = {"version": VERSION, "spec": spec.key_fields(), "task": task.fingerprint(),
               "files": source_signature(spec.data_dir)}
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cache_path(task: Task, spec: DataSpec) -> Path:
    return spec.cache_dir / f"{spec.task}-{spec.backbone.replace('/', '_')}-{spec.encoder}-{cache_key(task, spec)}.pt"


def _save(path: Path, data: PreparedData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(data, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole new file


def load(path: Path) -> PreparedData:
    return torch.load(path, weights_only=False)  # our own file; it holds dataclasses besides tensors


def prepare_cached(task: Task, spec: DataSpec) -> PreparedData:
    path = cache_path(task, spec)
    if path.exists():
        log.info("%s: cache hit %s", spec.task, path)
        return dataclasses.replace(load(path), spec=spec)
    if spec.encoder == "frozen" and task.uses_backbone:
        tokenized = prepare_cached(task, dataclasses.replace(spec, encoder="finetune"))
        data = freeze(tokenized, spec)
    else:
        data = task.build(spec)
    data = dataclasses.replace(data, spec=spec)
    _save(path, data)
    log.info("%s: cached %s", spec.task, path)
    return data


def freeze(data: PreparedData, spec: DataSpec) -> PreparedData:
    """Encode every split once with the backbone (no grad) and keep only the features."""
    from . import backbones
    from .featurize import encode_split

    encoder = backbones.load_backbone(data.model_info, spec.seed)
    token = data.kind == "token"
    splits: dict[str, Any] = {}
    for name in ("train", "validation", "test"):
        split = getattr(data, name)
        if split is not None:
            splits[name] = encode_split(encoder, split, token, f"{spec.task}: encoding {name} ({spec.backbone})")
    info = dict(data.model_info, encoder="frozen", feature_dim=int(data.model_info["hidden_size"]))
    return dataclasses.replace(data, model_info=info, **splits)
