"""On-disk store of prepared data: where an entry lives (its key) and atomic save / load. Nothing here builds
or encodes data: `preparation.prepare` decides what to store (tokenized tensors, then frozen features).

An entry is a `torch.save` of plain containers (dicts, lists, tuples, strings, numbers, None) and tensors: the
fields of `PreparedData`, its `Split`s and `Ragged`s as dicts, without the `DataSettings` (the caller's). It
is read with `torch.load(weights_only=True)`, which refuses any other object: a file planted under
$TUNE_AS_CACHE cannot run code. An entry that cannot be read back
(truncated, planted, another format) raises `Unreadable`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from .data import DataSettings, PreparedData, Ragged, Split

VERSION = 2  # bump when the layout of PreparedData changes: old entries are then ignored (1: pickled objects)
FORMAT = "tune_as prepared data"


class Unreadable(ValueError):
    """A cache entry that does not hold prepared data tune_as wrote: the caller rebuilds it."""


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
    name = (f"{spec.task}-{spec.backbone.replace('/', '_')}-{spec.encoder}-"
            f"{cache_key(task_fingerprint, spec)}.pt")
    return spec.cache_dir / name


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _plain_split(split: Split) -> dict[str, Any]:
    return dict(_fields(split), ragged=_fields(split.ragged) if split.ragged is not None else None)


def _split(fields: dict[str, Any]) -> Split:
    ragged = fields["ragged"]
    return Split(**dict(fields, ragged=Ragged(**ragged) if ragged is not None else None))


def save(path: Path, data: PreparedData) -> None:
    fields = _fields(data)
    del fields["spec"]  # the caller's, with paths: load() takes it
    for name in ("train", "validation", "test"):
        fields[name] = _plain_split(fields[name]) if fields[name] is not None else None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"format": FORMAT, "version": VERSION, "fields": fields}, tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old state or the whole new file


def load(path: Path, spec: DataSettings) -> PreparedData:
    """The entry `save` wrote, with `spec`; `Unreadable` (naming the file and what it holds) for anything
    else."""
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever breaks the read (truncated zip, a refused global, ...), rebuild
        raise Unreadable(f"{path}: expected prepared data tune_as cached, got a file it cannot read "
                         f"({type(exc).__name__})") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("version") != VERSION:
        raise Unreadable(f"{path}: expected prepared data tune_as cached, got another format "
                         f"({type(saved).__name__})")
    try:
        fields = dict(saved["fields"])
        for name in ("train", "validation", "test"):
            fields[name] = _split(fields[name]) if fields[name] is not None else None
        return PreparedData(**fields, spec=spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"{path}: expected prepared data tune_as cached, "
                         f"got fields it cannot rebuild it from ({type(exc).__name__})") from None
