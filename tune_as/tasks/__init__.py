"""Tasks: data (hub or local files), backbones, frozen-encoder cache, models and metrics.

    task = build_task("clinc_oos")
    data = task.prepare(DataSpec("clinc_oos", backbone="minilm", encoder="frozen"))
    model = build_model(data, head="linear", seed=0)
    scores = task.score([task.predict(model(data.validation.batch(idx))) for idx in batches], data.validation)
"""

from __future__ import annotations

from typing import Any

from .base import Task, TaskDefaults
from .data import DataSpec, PreparedData, Split
from .images import IMAGE_TASKS
from .models import build_model
from .text import TEXT_TASKS

TASKS: dict[str, Task] = {**TEXT_TASKS, **IMAGE_TASKS}


def build_task(name: str, **options: Any) -> Task:
    """The registered task `name`; options are accepted only by factories (`jsonl`)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: expected one of {', '.join(sorted(TASKS))}")
    if options:
        raise ValueError(f"task {name!r} takes no options, got {sorted(options)}")
    return TASKS[name]


__all__ = ["TASKS", "DataSpec", "PreparedData", "Split", "Task", "TaskDefaults", "build_model", "build_task"]
