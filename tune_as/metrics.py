"""Evaluation metrics, all in [0, 1], higher is better.

Multi-class inputs are (N,) integer tensors; multi-label inputs are (N, C) multi-hot tensors.
Division by zero gives 0 (scikit-learn's `zero_division=0`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


def _f1(tp: float, fp: float, fn: float) -> float:
    return _div(2 * tp, 2 * tp + fp + fn)


def accuracy(y_true: Tensor, y_pred: Tensor) -> float:
    return float((y_true == y_pred).float().mean()) if len(y_true) else 0.0


def binary_f1(y_true: Tensor, y_pred: Tensor, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's F1 for MRPC and QQP: 1 = paraphrase / duplicate)."""
    t, p = y_true == positive, y_pred == positive
    return _f1(float((t & p).sum()), float((~t & p).sum()), float((t & ~p).sum()))


def matthews(y_true: Tensor, y_pred: Tensor) -> float:
    """Matthews correlation (multi-class form of Gorodkin 2004; binary = the usual MCC). GLUE's CoLA metric.
    It lies in [-1, 1]; a constant prediction gives 0."""
    n_classes = int(max(int(y_true.max()), int(y_pred.max()))) + 1 if len(y_true) else 1
    cm = torch.zeros(n_classes, n_classes, dtype=torch.float64)
    cm.index_put_((y_true.long(), y_pred.long()), torch.ones(len(y_true), dtype=torch.float64), accumulate=True)
    t, p, c, s = cm.sum(1), cm.sum(0), cm.trace(), cm.sum()
    denom = torch.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    return float((c * s - (t * p).sum()) / denom) if denom > 0 else 0.0


def _one_hot(y: Tensor, n: int) -> Tensor:
    return torch.nn.functional.one_hot(y.long(), n).bool()


def _as_multi_hot(y_true: Tensor, y_pred: Tensor) -> tuple[Tensor, Tensor]:
    """Multi-class labels become one-hot over the classes seen in either (scikit-learn's label set)."""
    if y_true.dim() == 2:
        return y_true.bool(), y_pred.bool()
    labels = torch.unique(torch.cat([y_true, y_pred]))
    remap = {int(v): i for i, v in enumerate(labels)}
    t = torch.tensor([remap[int(v)] for v in y_true], dtype=torch.long)
    p = torch.tensor([remap[int(v)] for v in y_pred], dtype=torch.long)
    return _one_hot(t, len(labels)), _one_hot(p, len(labels))


def micro_f1(y_true: Tensor, y_pred: Tensor) -> float:
    t, p = _as_multi_hot(y_true, y_pred)
    return _f1(float((t & p).sum()), float((~t & p).sum()), float((t & ~p).sum()))


def macro_f1(y_true: Tensor, y_pred: Tensor) -> float:
    """Unweighted mean of per-class F1 over all C columns (multi-label) or the classes seen (multi-class)."""
    t, p = _as_multi_hot(y_true, y_pred)
    tp, fp, fn = (t & p).sum(0).double(), (~t & p).sum(0).double(), (t & ~p).sum(0).double()
    per_class = torch.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn).clamp(min=1), 0.0)
    return float(per_class.mean()) if len(per_class) else 0.0


def top_k_multi_hot(logits: Tensor, k: int) -> Tensor:
    """The k highest-scoring classes of each row as a bool (N, C) multi-hot (WOS-46985: k = 2)."""
    out = torch.zeros_like(logits, dtype=torch.bool)
    return out.scatter_(-1, logits.topk(k, dim=-1).indices, True)


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """Entity-level micro F1 of IOB2 tag sequences, as seqeval computes it (CoNLL-2003's metric)."""
    from seqeval.metrics import f1_score

    return float(f1_score([list(g) for g in gold], [list(p) for p in pred], zero_division=0))


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    pairs = [(g, p) for gs, ps in zip(gold, pred, strict=True) for g, p in zip(gs, ps, strict=True)]
    return _div(sum(g == p for g, p in pairs), len(pairs))


def csc_sentence_correction(sources: Sequence[str], targets: Sequence[str],
                            predictions: Sequence[str]) -> dict[str, float]:
    """Sentence-level correction precision / recall / F1 for Chinese spelling check, as SpellGCN
    (Cheng et al., 2020) and the works after it report for SIGHAN15.

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
