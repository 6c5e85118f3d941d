"""tune_as.tasks.metrics: hand-computed cases, an independent brute-force reference (plain loops over classes),
scikit-learn's binary F1, seqeval-style hand-counted entities, and hand-made SIGHAN cases."""

from __future__ import annotations

import math

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
    pairs = list(zip(t, p, strict=True))
    columns = [(sum(a[j] and b[j] for a, b in pairs), sum(not a[j] and b[j] for a, b in pairs),
                sum(a[j] and not b[j] for a, b in pairs)) for j in range(len(t[0]))]
    return {"macro_f1": sum(f1_of(*c) for c in columns) / len(columns),
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
    assert metrics.binary_f1(torch.tensor([0, 2]), torch.tensor([2, 0])) == 0.0  # class 1 nowhere: 0, no error


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
    # column 0: tp 1, fn 1 -> 2/3; column 1: 1; column 2: fp 1 -> 0; column 3 never positive -> 0 (not skipped)
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx((2 / 3 + 1 + 0 + 0) / 4)
    assert metrics.micro_f1(y_true, y_pred) == pytest.approx(f1_of(2, 1, 1))


# -- against the brute-force reference and scikit-learn's binary F1 ---------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("classes", [2, 6])
def test_multiclass_metrics_match_a_brute_force_reference(seed: int, classes: int) -> None:
    y_true, y_pred = random_labels(seed, classes=classes)
    expected = reference_multiclass(y_true.tolist(), y_pred.tolist())
    assert {name: fn(y_true, y_pred) for name, fn in metrics.MULTICLASS.items()} == pytest.approx(expected)


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


def test_top2_multi_hot_picks_the_two_largest() -> None:
    logits = torch.tensor([[0.1, 5.0, -2.0, 4.0], [-1.0, -2.0, -0.5, -3.0]])
    assert metrics.top_k_multi_hot(logits, 2).tolist() == [[False, True, False, True], [True, False, True, False]]


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
