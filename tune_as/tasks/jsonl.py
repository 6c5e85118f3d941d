"""`jsonl`: a user's own dataset from local `train/validation/test.jsonl[.gz]` files (or save_to_disk).

    build_task("jsonl", kind="multiclass", text_field="question", label_field="intent")
    build_task("jsonl", kind="multiclass", text_field="premise", text_pair_field="hypothesis")
    build_task("jsonl", kind="token", text_field="tokens", label_field="tags")      # lists per row, IOB2 tags
    build_task("jsonl", kind="multilabel", text_field="text", label_field="labels")  # a list of labels per row

Labels may be strings or integers; ids follow the sorted training labels. No validation file: 10% of train
is carved with a fixed seed (and a note says so).
"""

from __future__ import annotations

from .base import KINDS, Task, TaskDefaults
from .multilabel import MultiLabelText
from .text import TextClassification
from .token import TokenTagging

JSONL_DEFAULTS = TaskDefaults(5, 32, 2e-5, 128, "minilm")
DEFAULT_METRICS = {"multiclass": ("accuracy", "macro_f1"), "token": ("f1", "accuracy"),
                   "multilabel": ("micro_f1", "macro_f1")}
VALID_METRICS = {"multiclass": ("accuracy", "f1", "mcc", "macro_f1", "micro_f1"), "token": ("f1", "accuracy"),
                 "multilabel": ("micro_f1", "macro_f1")}


def jsonl_task(kind: str = "multiclass", text_field: str = "text", label_field: str = "label",
               text_pair_field: str | None = None, metrics: tuple[str, ...] | None = None) -> Task:
    if kind not in KINDS:
        raise ValueError(f"jsonl: kind: expected one of {KINDS}, got {kind!r}")
    options = {"kind": kind, "text_field": text_field, "label_field": label_field,
               "text_pair_field": text_pair_field, "metrics": metrics}
    metrics = tuple(metrics) if metrics is not None else DEFAULT_METRICS[kind]
    unknown = [m for m in metrics if m not in VALID_METRICS[kind]]
    if unknown or not metrics:
        raise ValueError(f"jsonl: metrics for kind {kind!r}: expected a non-empty subset of "
                         f"{VALID_METRICS[kind]}, got {metrics}")
    if kind == "token":
        if text_pair_field is not None:
            raise ValueError("jsonl: text_pair_field: expected None for kind 'token' (one word list per row)")
        return TokenTagging("jsonl", kind, metrics, JSONL_DEFAULTS, None,
                            fields={"words": (text_field,), "label": (label_field,)}, options=options)
    fields: dict[str, tuple[str, ...]] = {"text": (text_field,), "label": (label_field,)}
    if text_pair_field is not None:
        fields["text_pair"] = (text_pair_field,)
    family = MultiLabelText if kind == "multilabel" else TextClassification
    return family("jsonl", kind, metrics, JSONL_DEFAULTS, None, fields=fields, options=options)
