"""tune_as.metrics against scikit-learn, seqeval-style hand-counted entities, and hand-made SIGHAN cases."""

from __future__ import annotations

import pytest
import torch
from sklearn import metrics as skm

from tune_as import metrics

SEEDS = range(5)


def random_labels(seed: int, n: int = 200, classes: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y_true = torch.randint(0, classes, (n,), generator=g)
    noisy = torch.randint(0, classes, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.6  # correlated with the truth, so the scores are not all ~chance
    return y_true, torch.where(keep, y_true, noisy)


@pytest.mark.parametrize("seed", SEEDS)
def test_multiclass_metrics_match_sklearn(seed: int) -> None:
    y_true, y_pred = random_labels(seed)
    t, p = y_true.numpy(), y_pred.numpy()
    assert metrics.accuracy(y_true, y_pred) == pytest.approx(skm.accuracy_score(t, p))
    assert metrics.matthews(y_true, y_pred) == pytest.approx(skm.matthews_corrcoef(t, p))
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx(skm.f1_score(t, p, average="macro", zero_division=0))
    assert metrics.micro_f1(y_true, y_pred) == pytest.approx(skm.f1_score(t, p, average="micro", zero_division=0))


@pytest.mark.parametrize("seed", SEEDS)
def test_binary_f1_and_mcc_match_sklearn(seed: int) -> None:
    y_true, y_pred = random_labels(seed, classes=2)
    t, p = y_true.numpy(), y_pred.numpy()
    assert metrics.binary_f1(y_true, y_pred) == pytest.approx(skm.f1_score(t, p, pos_label=1))
    assert metrics.matthews(y_true, y_pred) == pytest.approx(skm.matthews_corrcoef(t, p))


def test_macro_f1_counts_classes_that_only_the_prediction_uses() -> None:
    y_true, y_pred = torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1])  # class 2 never true: its F1 is 0
    assert metrics.macro_f1(y_true, y_pred) == pytest.approx((2 / 3 + 1 + 0) / 3)


def test_mcc_of_a_constant_prediction_is_zero_and_perfect_is_one() -> None:
    y = torch.tensor([0, 1, 1, 0, 1])
    assert metrics.matthews(y, torch.ones_like(y)) == 0.0
    assert metrics.matthews(y, y) == pytest.approx(1.0)
    assert metrics.matthews(y, 1 - y) == pytest.approx(-1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_multilabel_f1_matches_sklearn(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    y_true = torch.rand(50, 9, generator=g) < 0.2
    y_pred = torch.where(torch.rand(50, 9, generator=g) < 0.7, y_true, torch.rand(50, 9, generator=g) < 0.2)
    y_true[:, 8] = False  # a class with no gold positives
    for average, fn in (("micro", metrics.micro_f1), ("macro", metrics.macro_f1)):
        expected = skm.f1_score(y_true.numpy(), y_pred.numpy(), average=average, zero_division=0)
        assert fn(y_true, y_pred) == pytest.approx(expected)


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
