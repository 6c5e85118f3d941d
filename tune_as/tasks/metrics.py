"""Evaluation metrics, all in [0, 1] (Matthews correlation: [-1, 1]), higher is better.

Multi-class inputs are (N,) integer tensors; multi-label inputs are (N, C) multi-hot tensors. Classification
scores are scikit-learn's (entity F1 is seqeval's), except two written here: SIGHAN's sentence-level
correction F1, because no library computes it, and the multi-label F1s, counted column-wise with numpy
(scikit-learn's f1_score takes ~2.5 s per call on EURLEX57K's 6,000 x 4,271 test matrix, numpy ~0.05 s;
tests/test_metrics.py checks them against f1_score). Division by zero gives 0 (`zero_division=0`).

Macro-F1 averages over the labels present in the scored split: those with at least one gold or one
predicted positive. That is scikit-learn's own rule for multi-class input (``unique_labels(y_true, y_pred)``)
carried over to multi-hot columns; a label with neither has no defined F1 (0 / 0), and counting it as 0
(what f1_score does for multi-hot input unless given ``labels``) would cap EURLEX57K's macro-F1 at the share
of its 4,271 labels that occur in the split. A label only predicted scores 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def _sklearn() -> Any:
    # Imported on first use: sklearn.metrics adds ~1.5 s to every `import tune_as.tasks` (CLI start, each
    # Ray worker) although only scoring needs it.
    from sklearn import metrics

    return metrics


def _numpy(y: Tensor) -> np.ndarray:
    return y.detach().cpu().numpy()


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


def accuracy(y_true: Tensor, y_pred: Tensor) -> float:
    """The fraction of rows predicted exactly (multi-label (N, C): every label of the row, as scikit-learn's
    subset accuracy). Counted here, not with sklearn's accuracy_score (tests/test_metrics.py checks it is
    sklearn's): importing sklearn.metrics costs ~1.1 s in each fresh Ray worker, paid at the first evaluation
    of every Tuner's trials (each search and each confirmation round), for one comparison and one mean."""
    if y_true.shape != y_pred.shape or y_true.numel() == 0:
        raise ValueError(f"expected labels and predictions of one non-empty shape, "
                         f"got {tuple(y_true.shape)} and {tuple(y_pred.shape)}")
    exact = _numpy(y_true) == _numpy(y_pred)
    return float(exact.reshape(len(exact), -1).all(axis=1).mean())


def binary_f1(y_true: Tensor, y_pred: Tensor, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's F1 for MRPC and QQP: 1 = paraphrase / duplicate)."""
    # labels=[positive] scores that one class whatever the others are (average="binary" refuses 3 classes).
    return float(_sklearn().f1_score(_numpy(y_true), _numpy(y_pred), labels=[positive], average="macro",
                                     zero_division=0))


def matthews(y_true: Tensor, y_pred: Tensor) -> float:
    """Matthews correlation (multi-class form of Gorodkin 2004; binary = the usual MCC). GLUE's CoLA metric.
    It lies in [-1, 1]; a constant prediction gives 0."""
    return float(_sklearn().matthews_corrcoef(_numpy(y_true), _numpy(y_pred)))


def micro_f1(y_true: Tensor, y_pred: Tensor) -> float:
    """Micro F1: multi-label (N, C) 2 TP / (2 TP + FP + FN) summed over all labels; multi-class (N,) over the
    classes seen in either input (= accuracy)."""
    if y_true.dim() == 2:
        tp, pred, gold = label_counts(y_true, y_pred)
        return _div(2.0 * tp.sum(), float(pred.sum() + gold.sum()))
    return float(_sklearn().f1_score(_numpy(y_true), _numpy(y_pred), average="micro", zero_division=0))


def macro_f1(y_true: Tensor, y_pred: Tensor) -> float:
    """Unweighted mean of per-class F1 over the classes present: at least one gold or predicted positive
    (multi-label (N, C) columns; multi-class (N,) classes seen in either input); 0 when none is."""
    if y_true.dim() == 2:
        tp, pred, gold = label_counts(y_true, y_pred)
        present = pred + gold > 0
        return float(np.mean(2.0 * tp[present] / (pred + gold)[present])) if present.any() else 0.0
    return float(_sklearn().f1_score(_numpy(y_true), _numpy(y_pred), average="macro", zero_division=0))


def label_counts(y_true: Tensor, y_pred: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per label (C,) int64, of multi-hot (N, C) inputs: true positives, predicted positives, gold positives.
    Column sums of byte views: no loop over labels or documents."""
    t, p = (_numpy(y).astype(bool, copy=False) for y in (y_true, y_pred))
    if t.shape != p.shape or t.ndim != 2:
        raise ValueError(f"expected two multi-hot (N, C) inputs of one shape, got {t.shape} and {p.shape}")

    def column_sums(a: np.ndarray) -> np.ndarray:
        return a.view(np.uint8).sum(axis=0, dtype=np.int64)

    return column_sums(t & p), column_sums(p), column_sums(t)


def top_k_multi_hot(logits: Tensor, k: int) -> Tensor:
    """The k highest-scoring classes of each row as a bool (N, C) multi-hot (WOS-46985: k = 2)."""
    out = torch.zeros_like(logits, dtype=torch.bool)
    return out.scatter_(-1, logits.topk(k, dim=-1).indices, True)


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Entity-level micro F1 of IOB2 tag sequences, as seqeval computes it (CoNLL-2003's metric)."""
    from seqeval.metrics import f1_score

    return float(f1_score([list(g) for g in gold], [list(p) for p in pred], zero_division=0))


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Accuracy over every word of every row (rows must have equal lengths)."""
    pairs = [(g, p) for gs, ps in zip(gold, pred, strict=True) for g, p in zip(gs, ps, strict=True)]
    return float(_sklearn().accuracy_score([g for g, _ in pairs], [p for _, p in pairs]))


def csc_sentence_correction(sources: Sequence[str], targets: Sequence[str],
                            predictions: Sequence[str]) -> dict[str, float]:
    """Sentence-level correction precision / recall / F1 for Chinese spelling check, as SpellGCN
    (Cheng et al., 2020) and the works after it report for SIGHAN15. Written here: no library has it (it is
    not a per-token or per-class F1, so scikit-learn's and seqeval's do not apply).

    For each sentence, gold edits G = {(i, target[i]) : target[i] != source[i]} and predicted edits
    P = {(i, prediction[i]) : prediction[i] != source[i]}. A sentence is a true positive when P is
    non-empty and P == G (every error found and corrected, nothing else changed). Then
    precision = TP / #{sentences with P non-empty}, recall = TP / #{sentences with G non-empty},
    F1 = 2PR / (P + R). Error-free sentences left untouched count nowhere; touching them costs precision.
    """
    tp = n_pred = n_gold = 0
    for src, tgt, prd in zip(sources, targets, predictions, strict=True):
        if not len(src) == len(tgt) == len(prd):
            raise ValueError(f"expected same-length source/target/prediction, got {len(src)}/{len(tgt)}/"
                             f"{len(prd)} for {src!r}")
        gold = {(i, c) for i, (s, c) in enumerate(zip(src, tgt, strict=True)) if s != c}
        edits = {(i, c) for i, (s, c) in enumerate(zip(src, prd, strict=True)) if s != c}
        n_gold += bool(gold)
        n_pred += bool(edits)
        tp += bool(edits) and edits == gold
    precision, recall = _div(tp, n_pred), _div(tp, n_gold)
    return {"precision": precision, "recall": recall, "f1": _div(2 * precision * recall, precision + recall)}


Metric = Callable[[Tensor, Tensor], float]
MULTICLASS: dict[str, Metric] = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "mcc": matthews,
    "macro_f1": macro_f1,
    "micro_f1": micro_f1,
}
MULTILABEL: dict[str, Metric] = {"micro_f1": micro_f1, "macro_f1": macro_f1}
