"""GLUE (AS-Softmax paper, Table 8): sentence and sentence-pair classification with GLUE's own metrics.

Hub: `nyu-mll/glue` <config>. GLUE hides its test labels (-1 on the hub): test = None there, and the
trainer skips test metrics. MNLI evaluates on validation_matched. Defaults follow RoBERTa's GLUE recipe
(Liu et al. 2019, which the paper cites for its shared settings): 10 epochs, batch 32, lr 2e-5.
"""

from __future__ import annotations

from .base import DEFAULT_STEMS, TaskDefaults
from .sources import HubSource
from .text import TextClassification

GLUE_DEFAULTS = TaskDefaults(10, 32, 2e-5, 128, "FacebookAI/roberta-base")

# name: (metrics, first text field, second text field or None). Local files may use text / text_pair.
GLUE = {
    "mnli": (("accuracy",), "premise", "hypothesis"),
    "mrpc": (("f1", "accuracy"), "sentence1", "sentence2"),
    "qnli": (("accuracy",), "question", "sentence"),
    "qqp": (("f1", "accuracy"), "question1", "question2"),
    "rte": (("accuracy",), "sentence1", "sentence2"),
    "sst2": (("accuracy",), "sentence", None),
    "cola": (("mcc",), "sentence", None),
}


def _glue_task(name: str, metrics: tuple[str, ...], first: str, second: str | None) -> TextClassification:
    fields = {"text": (first, "text"), "label": ("label",)}
    if second is not None:
        fields["text_pair"] = (second, "text_pair")
    stems = dict(DEFAULT_STEMS, validation=("validation_matched", *DEFAULT_STEMS["validation"]))
    return TextClassification(name, "multiclass", metrics, GLUE_DEFAULTS, HubSource("nyu-mll/glue", name),
                              stems=stems, fields=fields)


GLUE_TASKS = {name: _glue_task(name, *spec) for name, spec in GLUE.items()}
