"""On-disk store of prepared data: where an entry lives (its key) and atomic save / load. Nothing here builds
or encodes data: `preparation.prepare` decides what to store (tokenized tensors, then frozen features)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from .data import DataSettings, PreparedData

VERSION = 2  # bump when the layout of PreparedData changes: old entries are then ignored


def source_signature(data_dir: Path | None) -> list[tuple[str, int, int]]:
    """Files under data_dir with size and mtime: editing the data invalidates the cache."""
    if data_dir is None or not data_dir.is_dir():
        return []
    files = sorted(p for p in data_dir.rglob("*") if p.is_file())
    return [(str(p.relative_to(data_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def cache_key(task_fingerprint: dict[str, Any], spec: DataSettings) -> str:
    """Hash of the spec, the task's configuration (`Task.fingerprint()`) and the source files."""
    payload = {"version": VERSION, "spec": spec.key_fields(), "task": task_fingerprint,
               "files": source_signature(spec.data_dir)}
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cache_path(task_fingerprint: dict[str, Any], spec: DataSettings) -> Path:
    name = f"{spec.task}-{spec.backbone.replace('/', '_')}-{spec.encoder}-{cache_key(task_fingerprint, spec)}.pt"
    return spec.cache_dir / name


def save(path: Path, data: PreparedData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(data, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole new file


def load(path: Path) -> PreparedData:
    return torch.load(path, weights_only=False)  # our own file; it holds dataclasses besides tensors
