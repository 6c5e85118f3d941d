"""Tasks: data (hub or local files), backbones, frozen-encoder cache, models and metrics.

    task = build_task("clinc_oos")
    data = prepare(task, DataSettings("clinc_oos", backbone="minilm", encoder="frozen"))
    model = build_model(data, head="linear", seed=0)
    scores = task.score([task.predict(model(data.validation.batch(idx))) for idx in batches], data.validation)

See docs/tasks.md for the table of tasks, their defaults and how to load local data.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .base import Task, TaskDefaults
from .data import DataSettings, PreparedData, Split
from .glue import GLUE_TASKS
from .images import IMAGE_TASKS
from .jsonl import jsonl_task
from .models import build_model
from .multilabel import MULTILABEL_TASKS
from .preparation import prepare
from .text import TEXT_TASKS
from .token import TOKEN_TASKS

TASKS: dict[str, Task] = {
    **TEXT_TASKS, **TOKEN_TASKS, **MULTILABEL_TASKS, **GLUE_TASKS, **IMAGE_TASKS, "jsonl": jsonl_task(),
}
# Tasks configured by the caller: build_task(name, **options) calls the factory.
FACTORIES: dict[str, Callable[..., Task]] = {"jsonl": jsonl_task}


def build_task(name: str, **options: Any) -> Task:
    """The registered task `name`; `jsonl` takes options (kind, text_field, label_field, ...)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: expected one of {', '.join(sorted(TASKS))}")
    if not options:
        return TASKS[name]
    if name not in FACTORIES:
        raise ValueError(f"task {name!r} takes no options, got {sorted(options)}")
    accepted = list(inspect.signature(FACTORIES[name]).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"task {name!r}: unknown options {unknown}; expected some of {accepted}")
    return FACTORIES[name](**options)


__all__ = ["TASKS", "DataSettings", "PreparedData", "Split", "Task", "TaskDefaults", "build_model",
           "build_task", "prepare"]
