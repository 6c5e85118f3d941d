"""`prepare(task, spec)`: a task's data, built once and then read from the disk cache.

Two cache levels: tokenized tensors (key without the encoder mode) and frozen features (key with it). A
frozen prepare reuses the tokenized level and encodes it once; a trial never tokenizes or encodes.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Protocol

from . import cache, chunks
from .data import DataSettings, PreparedData
from .featurize import freeze

log = logging.getLogger(__name__)


class Preparable(Protocol):
    """What `prepare` needs of a task (every `Task` is one): its name, whether it has a text backbone to
    freeze, what besides the spec changes its data, how to build that data uncached, and the line that says
    what the prepared data is (None: nothing to say)."""

    @property
    def name(self) -> str: ...

    @property
    def uses_backbone(self) -> bool: ...

    def fingerprint(self) -> dict[str, Any]: ...

    def default_data_dir(self) -> Path | None: ...

    def build(self, spec: DataSettings) -> PreparedData: ...

    def summary(self, data: PreparedData) -> str | None: ...


def prepare(task: Preparable, spec: DataSettings) -> PreparedData:
    """Load, label, subsample and featurize `task`'s data as `spec` says, through the disk cache, and log the
    task's one-line summary of it (`Task.summary`), built or read.

    No data_dir: the task's local copy when it has one (`Task.default_data_dir`), else its hub dataset. The
    copy becomes the spec's data_dir, so the cache key holds its files and `PreparedData.spec` says what was
    read."""
    if spec.task != task.name:
        raise ValueError(f"DataSettings.task: expected {task.name!r} for this task, got {spec.task!r}")
    local = task.default_data_dir() if spec.data_dir is None else None
    if local is not None:
        log.info("%s: no data_dir given: reading the local copy %s", spec.task, local)
        spec = dataclasses.replace(spec, data_dir=local)
    data = _cached(task, spec)
    line = task.summary(data)
    if line:
        log.warning(line)  # the level the CLI shows
    return data


def _cached(task: Preparable, spec: DataSettings) -> PreparedData:
    path = cache.cache_path(task.fingerprint(), spec)
    partial = chunks.partial_dir(path)  # a frozen encode's finished chunks, until the entry is saved
    if path.exists():
        try:
            data = cache.load(path, spec)
            log.info("%s: cache hit %s", spec.task, path)
            for warning in data.warnings:  # printed whenever the data is prepared, built or read
                log.warning(warning)
            chunks.remove(partial)  # left by a run stopped between saving the entry and removing it
            return data
        except cache.Unreadable as exc:  # damaged or planted: never trusted, built again (and overwritten)
            log.warning("%s; rebuilding it", exc)
    if spec.encoder == "frozen" and task.uses_backbone:
        data = freeze(_cached(task, dataclasses.replace(spec, encoder="finetune")), spec, partial)
    else:
        data = task.build(spec)
    data = dataclasses.replace(data, spec=spec)
    cache.save(path, data)
    chunks.remove(partial)  # the entry holds every chunk now
    log.info("%s: cached %s", spec.task, path)
    return data
