"""`jsonl`: a user's own dataset from local `train/validation/test.jsonl[.gz]` files (or save_to_disk).

    build_task("jsonl", kind="multiclass", text_field="question", label_field="intent")
    build_task("jsonl", kind="multiclass", text_field="premise", text_pair_field="hypothesis",
               metrics="accuracy,f1")
    # lists per row, IOB2 tags
    build_task("jsonl", kind="token", text_field="tokens", label_field="tags")
    # a list of labels per row
    build_task("jsonl", kind="multilabel", text_field="text", label_field="labels")

Labels may be strings or integers; ids follow the sorted training labels. No validation file: 10% of train
is carved with a fixed seed (and a note says so).
"""

from __future__ import annotations

from collections.abc import Sequence

from tune_as.losses import KINDS

from .base import Task, TaskDefaults
from .multilabel import MultiLabelText
from .text import TextClassification
from .token import TokenTagging

JSONL_DEFAULTS = TaskDefaults(5, 32, 2e-5, 128, "minilm")
DEFAULT_METRICS = {"multiclass": ("accuracy", "macro_f1"), "token": ("f1", "accuracy"),
                   "multilabel": ("micro_f1", "macro_f1")}
VALID_METRICS = {"multiclass": ("accuracy", "f1", "mcc", "macro_f1", "micro_f1"), "token": ("f1", "accuracy"),
                 "multilabel": ("micro_f1", "macro_f1")}


def metric_names(metrics: str | Sequence[str]) -> tuple[str, ...]:
    """A sequence of names, or one string of comma-separated names (how `--task-arg metrics=a,b` arrives)."""
    names = metrics.split(",") if isinstance(metrics, str) else metrics
    return tuple(m.strip() for m in names if m.strip())


def jsonl_task(kind: str = "multiclass", text_field: str = "text", label_field: str = "label",
               text_pair_field: str | None = None, metrics: str | Sequence[str] | None = None) -> Task:
    if kind not in KINDS:
        raise ValueError(f"jsonl: kind: expected one of {KINDS}, got {kind!r}")
    names = {"text_field": text_field, "label_field": label_field, "text_pair_field": text_pair_field}
    for option, value in names.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"jsonl: {option}: expected a field name, got {value!r}")
    if label_field in (text_field, text_pair_field):
        raise ValueError(f"jsonl: label_field: expected a field other than the text fields, "
                         f"got {label_field!r}, which is also a text field")
    chosen = metric_names(metrics) if metrics is not None else DEFAULT_METRICS[kind]
    if not chosen or any(m not in VALID_METRICS[kind] for m in chosen):
        raise ValueError(f"jsonl: metrics for kind {kind!r}: expected a non-empty subset of "
                         f"{VALID_METRICS[kind]} (comma-separated), got {metrics!r}")
    options = dict(names, kind=kind, metrics=chosen if metrics is not None else None)
    if kind == "token":
        if text_pair_field is not None:
            raise ValueError("jsonl: text_pair_field: expected None for kind 'token' (one word list per row)")
        return TokenTagging("jsonl", kind, chosen, JSONL_DEFAULTS, None,
                            fields={"words": (text_field,), "label": (label_field,)}, options=options)
    fields: dict[str, tuple[str, ...]] = {"text": (text_field,), "label": (label_field,)}
    if text_pair_field is not None:
        fields["text_pair"] = (text_pair_field,)
    family = MultiLabelText if kind == "multilabel" else TextClassification
    return family("jsonl", kind, chosen, JSONL_DEFAULTS, None, fields=fields, options=options)
