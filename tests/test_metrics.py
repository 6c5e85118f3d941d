"""tune_as.tasks.metrics: hand-computed cases, an independent brute-force reference (plain loops over
classes), scikit-learn's binary and multi-label F1 (at EURLEX57K's 6,000 x 4,271 too), seqeval-style
hand-counted entities, and hand-made SIGHAN cases."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from tune_as.tasks import metrics

SEEDS = range(5)


def random_labels(seed: int, n: int = 200, classes: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y_true = torch.randint(0, classes, (n,), generator=g)
    noisy = torch.randint(0, classes, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.6  # correlated with the truth, so the scores are not all ~chance
    return y_true, torch.where(keep, y_true, noisy)


def f1_of(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def reference_multiclass(t: list[int], p: list[int]) -> dict[str, float]:
    """Brute force over the classes seen in either list; MCC by Gorodkin's formula on the confusion counts."""
    pairs = list(zip(t, p, strict=True))
    classes = sorted(set(t) | set(p))
    counts = [(sum(a == c and b == c for a, b in pairs), sum(a != c and b == c for a, b in pairs),
               sum(a == c and b != c for a, b in pairs)) for c in classes]
    n, correct = len(pairs), sum(a == b for a, b in pairs)
    true_k, pred_k = [t.count(c) for c in classes], [p.count(c) for c in classes]
    num = correct * n - sum(true_k[k] * pred_k[k] for k in range(len(classes)))
    den = math.sqrt((n * n - sum(x * x for x in pred_k)) * (n * n - sum(x * x for x in true_k)))
    return {"accuracy": correct / n, "f1": f1_of(*counts[classes.index(1)]) if 1 in classes else 0.0,
            "mcc": num / den if den else 0.0, "macro_f1": sum(f1_of(*c) for c in counts) / len(classes),
            "micro_f1": f1_of(*(sum(c[i] for c in counts) for i in range(3)))}


def reference_multilabel(t: list[list[bool]], p: list[list[bool]]) -> dict[str, float]:
    """Brute force over columns; macro over the columns with a gold or predicted positive."""
    pairs = list(zip(t, p, strict=True))
    columns = [(sum(a[j] and b[j] for a, b in pairs), sum(not a[j] and b[j] for a, b in pairs),
                sum(a[j] and not b[j] for a, b in pairs)) for j in range(len(t[0]))]
    present = [c for c in columns if sum(c)]
    return {"macro_f1": sum(f1_of(*c) for c in present) / len(present) if present else 0.0,
            "micro_f1": f1_of(*(sum(c[i] for c in columns) for i in range(3)))}


# -- hand-computed cases ----------------------------------------------------------------------------------
def test_binary_case_by_hand_through_the_registry() -> None:
    # tp = 2 (rows 0, 4), fp = 1 (row 2), fn = 1 (row 1), tn = 1 (row 3)
    y_true, y_pred = torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 0, 1, 0, 1])
    expected = {"accuracy": 3 / 5, "f1": 2 / 3,
                "mcc": (2 * 1 - 1 * 1) / math.sqrt(3 * 3 * 2 * 2),  # (tp*tn - fp*fn) / sqrt(...) = 1/6
                "macro_f1": (1 / 2 + 2 / 3) / 2,  # class 0: tp 1, fp 1, fn 1; class 1: 2/3
                "micro_f1": 3 / 5}  # single-label micro F1 = accuracy
    got = {name: fn(y_true, y_pred) for name, fn in metrics.MULTICLASS.items()}
    assert got == pytest.approx(expected)


def test_three_class_cases_by_hand() -> None:
    y_true, y_pred = torch.tensor([0, 1, 2, 0]), torch.tensor([0, 1, 1, 0])
    # correct 3 of 4; true counts (2, 1, 1), predicted (2, 2, 0): (3*4 - 6) / sqrt((16 - 8) * (16 - 6))
    assert metrics.matthews(y_true, y_pred) == pytest.approx(6 / math.sqrt(80))
    assert metrics.accuracy(y_true, y_pred) == pytest.approx(3 / 4)
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx((1 + 2 / 3 + 0) / 3)
    # binary F1 reads class 1 only, whatever the other classes are: tp 1, fp 1 (row 2), fn 0
    assert metrics.binary_f1(y_true, y_pred) == pytest.approx(2 / 3)
    # class 1 nowhere: 0, no error
    assert metrics.binary_f1(torch.tensor([0, 2]), torch.tensor([2, 0])) == 0.0


def test_macro_f1_counts_classes_that_only_the_prediction_uses() -> None:
    y_true, y_pred = torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1])  # class 2 never true: its F1 is 0
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert metrics.micro_f1(y_true, y_pred) == pytest.approx(2 / 3)


def test_mcc_of_a_constant_prediction_is_zero_and_perfect_is_one() -> None:
    y = torch.tensor([0, 1, 1, 0, 1])
    assert metrics.matthews(y, torch.ones_like(y)) == 0.0
    assert metrics.matthews(y, y) == pytest.approx(1.0)
    assert metrics.matthews(y, 1 - y) == pytest.approx(-1.0)


def test_multilabel_case_by_hand_with_an_empty_column() -> None:
    y_true = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    y_pred = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)
    # column 0: tp 1, fn 1 -> 2/3; column 1: 1; column 2, only predicted: fp 1 -> 0 (counted);
    # column 3, neither gold nor predicted: not a label of this split (skipped, not 0)
    for scores in (metrics.MULTILABEL, metrics.MULTICLASS):  # one rule whichever registry names it
        assert scores["macro_f1"](y_true, y_pred) == pytest.approx((2 / 3 + 1 + 0) / 3)
        assert scores["micro_f1"](y_true, y_pred) == pytest.approx(f1_of(2, 1, 1))
    nothing = torch.zeros_like(y_true)
    assert metrics.macro_f1(nothing, nothing) == metrics.micro_f1(nothing, nothing) == 0.0  # no label present
    assert metrics.macro_f1(y_true, nothing) == 0.0 and metrics.macro_f1(y_true.float(), y_pred.long()) > 0.5
    with pytest.raises(ValueError, match=r"expected two multi-hot \(N, C\) inputs of one shape"):
        metrics.macro_f1(y_true, y_pred[:, :3])


# -- against the brute-force reference and scikit-learn's binary F1 ---------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("classes", [2, 6])
def test_multiclass_metrics_match_a_brute_force_reference(seed: int, classes: int) -> None:
    y_true, y_pred = random_labels(seed, classes=classes)
    expected = reference_multiclass(y_true.tolist(), y_pred.tolist())
    assert {name: fn(y_true, y_pred) for name, fn in metrics.MULTICLASS.items()} == pytest.approx(expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("classes", [2, 6])
def test_accuracy_is_sklearns_for_labels_and_multi_hot_rows(seed: int, classes: int) -> None:
    y_true, y_pred = random_labels(seed, classes=classes)
    assert metrics.accuracy(y_true, y_pred) == \
        pytest.approx(skm.accuracy_score(y_true.numpy(), y_pred.numpy()))
    g = torch.Generator().manual_seed(seed)
    gold, pred = (torch.rand(40, classes, generator=g) < 0.3 for _ in range(2))
    pred[::3] = gold[::3]  # some rows exact, so the subset accuracy is not 0
    assert metrics.accuracy(gold, pred) == pytest.approx(skm.accuracy_score(gold.numpy(), pred.numpy()))
    with pytest.raises(ValueError,
                       match=r"expected labels and predictions of one non-empty shape, got \(3,\) and"):
        metrics.accuracy(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))


@pytest.mark.parametrize("seed", SEEDS)
def test_binary_f1_is_sklearns_binary_f1(seed: int) -> None:
    y_true, y_pred = random_labels(seed, classes=2)
    assert metrics.binary_f1(y_true, y_pred) == pytest.approx(skm.f1_score(y_true.numpy(), y_pred.numpy()))
    flipped = metrics.binary_f1(y_true, y_pred, positive=0)
    assert flipped == pytest.approx(skm.f1_score(y_true.numpy(), y_pred.numpy(), pos_label=0))


@pytest.mark.parametrize("seed", SEEDS)
def test_multilabel_f1_matches_a_brute_force_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    y_true = torch.rand(50, 9, generator=g) < 0.2
    y_pred = torch.where(torch.rand(50, 9, generator=g) < 0.7, y_true, torch.rand(50, 9, generator=g) < 0.2)
    y_true[:, 8] = False  # a class with no gold positives
    expected = reference_multilabel(y_true.tolist(), y_pred.tolist())
    assert {name: fn(y_true, y_pred) for name, fn in metrics.MULTILABEL.items()} == pytest.approx(expected)


def sparse_multilabel(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-hot gold and predictions (n, c) with EURLEX-like skew: most labels rare, many absent from the
    split; predictions keep ~60 % of the gold positives and add false ones (some on labels never gold)."""
    g = torch.Generator().manual_seed(seed)
    freq = torch.rand(c, generator=g) ** 8 * 0.02  # (c,) per-label rate: a few common, most near 0
    y_true = torch.rand(n, c, generator=g) < freq
    y_pred = (torch.rand(n, c, generator=g) < freq * 1.1) | (y_true & (torch.rand(n, c, generator=g) < 0.6))
    y_true[:, -2:], y_pred[:, -2] = False, False  # label c-2 absent from the split, c-1 only predicted
    y_pred[0, -1] = True
    return y_true, y_pred


def sklearn_multilabel(y_true: torch.Tensor, y_pred: torch.Tensor) -> dict[str, float]:
    t, p = y_true.numpy(), y_pred.numpy()
    present = np.flatnonzero(t.any(axis=0) | p.any(axis=0))  # the labels this split has (gold or predicted)
    return {"micro_f1": skm.f1_score(t, p, average="micro", zero_division=0),
            "macro_f1": skm.f1_score(t, p, labels=present, average="macro", zero_division=0)}


@pytest.mark.parametrize(("n", "c"), [(40, 12), (300, 50)])
def test_multilabel_f1_is_sklearns_over_the_labels_present(n: int, c: int) -> None:
    y_true, y_pred = sparse_multilabel(n, c, seed=c)
    absent = ~(y_true.any(0) | y_pred.any(0))
    assert absent[-2] and not absent[-1]
    got = {name: fn(y_true, y_pred) for name, fn in metrics.MULTILABEL.items()}
    assert got == pytest.approx(sklearn_multilabel(y_true, y_pred), rel=1e-12)
    all_columns = skm.f1_score(y_true.numpy(), y_pred.numpy(), average="macro", zero_division=0)
    assert got["macro_f1"] == pytest.approx(all_columns * c / (c - int(absent.sum())))  # absent: not zeros


@pytest.mark.slow
def test_multilabel_f1_at_eurlex_test_size_is_sklearns_and_fast() -> None:
    """EURLEX57K's test split: 6,000 documents x 4,271 labels, about 5 gold labels each, most labels
    absent."""
    y_true, y_pred = sparse_multilabel(6000, 4271, seed=0)
    assert 2 < y_true.sum(1).float().mean() < 12 and int((y_true.any(0) | y_pred.any(0)).sum()) < 4271 * 0.9
    start = time.perf_counter()
    got = {name: fn(y_true, y_pred) for name, fn in metrics.MULTILABEL.items()}
    took = time.perf_counter() - start
    assert got == pytest.approx(sklearn_multilabel(y_true, y_pred), rel=1e-12)
    assert took < 1.0, f"multi-label F1s took {took:.2f} s at 6,000 x 4,271 (sklearn: ~2.5 s each)"


def test_top2_multi_hot_picks_the_two_largest() -> None:
    logits = torch.tensor([[0.1, 5.0, -2.0, 4.0], [-1.0, -2.0, -0.5, -3.0]])
    assert metrics.top_k_multi_hot(logits, 2).tolist() == \
        [[False, True, False, True], [True, False, True, False]]


def test_entity_f1_hand_counted() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
    # PER right; LOC typed as ORG (1 FP + 1 FN); ORG right; MISC cut short (1 FP + 1 FN)
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-MISC", "O"]]
    # TP = 2, FP = 2, FN = 2 -> P = R = F1 = 0.5
    assert metrics.entity_f1(gold, pred) == pytest.approx(0.5)
    assert metrics.entity_f1(gold, gold) == 1.0
    assert metrics.entity_f1(gold, [["O"] * 4] * 2) == 0.0
    assert metrics.token_accuracy(gold, pred) == pytest.approx(6 / 8)


def test_entity_f1_follows_conlleval_for_a_dangling_inside_tag() -> None:
    # conlleval (and seqeval's default mode) opens an entity at an I- tag that follows O
    assert metrics.entity_f1([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]]) == 1.0


def test_sighan_sentence_correction_hand_made_example() -> None:
    sources = ["我爱北惊", "他去学较", "今天天气好", "你号吗", "谢谢你", "在再见", "天天"]
    targets = ["我爱北京", "他去学校", "今天天气好", "你好吗", "谢谢你", "再再见", "天天"]
    predictions = [
        "我爱北京",    # error fixed exactly: TP
        "他去学教",    # error found, wrong character: predicted edits != gold, so not a TP
        "今天天汽好",  # no error, a character changed: counts in the predicted set, not a TP (FP)
        "你号吗",      # error missed: counts only in the gold set (FN)
        "谢谢你",      # no error, untouched: counts nowhere
        "再再见",      # error fixed: TP
        "天大",        # no error, changed: FP
    ]
    # gold sentences with errors: 1, 2, 4, 6 -> 4; sentences with predicted edits: 1, 2, 3, 6, 7 -> 5; TP = 2
    result = metrics.csc_sentence_correction(sources, targets, predictions)
    precision, recall = 2 / 5, 2 / 4
    assert result["precision"] == pytest.approx(precision) and result["recall"] == pytest.approx(recall)
    assert result["f1"] == pytest.approx(2 * precision * recall / (precision + recall))


def test_sighan_partial_correction_is_not_a_true_positive() -> None:
    # two errors, only one corrected: the sentence is not corrected
    result = metrics.csc_sentence_correction(["一二三"], ["壹贰三"], ["壹二三"])
    assert result == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    with pytest.raises(ValueError, match="expected same-length source/target/prediction, got 3/3/2"):
        metrics.csc_sentence_correction(["一二三"], ["壹贰三"], ["壹二"])


def test_multiclass_registry_names_are_what_tasks_declare() -> None:
    from tune_as.tasks import TASKS

    for task in TASKS.values():
        if task.kind == "multiclass":
            assert set(task.metrics) <= set(metrics.MULTICLASS), task.name
        if task.kind == "multilabel":
            assert set(task.metrics) <= set(metrics.MULTILABEL), task.name
