"""benchmarks/efficiency_scores.py's measured noise floor: the gap a perfect search scores (pure, no training)."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def scores():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("efficiency_scores")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_measured_floor_averages_every_subset_against_the_reference(scores) -> None:
    ref = {"softmax": {"test": 0.95}, "am_softmax": {"test": 0.90}}
    truth = {"softmax": {1000: 0.94, 1001: 0.96, 1002: 0.98}, "am_softmax": {1000: 0.90, 1001: 0.90, 1002: 0.90}}
    # softmax: single runs miss by 1, 1, 3 points; pairs (0.95, 0.96, 0.97) by 0, 1, 2; all three (0.96) by 1
    # am_softmax: every subset is exactly the reference
    assert scores.measured_floor(ref, truth, 1) == pytest.approx((5 / 3 + 0) / 2)
    assert scores.measured_floor(ref, truth, 2) == pytest.approx((1 + 0) / 2)
    assert scores.measured_floor(ref, truth, 3) == pytest.approx((1 + 0) / 2)


def test_measured_floor_leaves_out_a_loss_with_too_few_runs(scores) -> None:
    ref = {"softmax": {"test": 0.95}, "as_speed": {"test": 0.90}}
    truth = {"softmax": {1000: 0.96, 1001: 0.96}, "as_speed": {1000: 0.50}}  # as_speed: one run (others diverged)
    assert scores.measured_floor(ref, truth, 2) == pytest.approx(1.0)
    assert math.isnan(scores.measured_floor(ref, {"softmax": {}}, 1))


def test_gap_goal_names_the_floor_without_changing_its_verdict(scores) -> None:
    null = {"wrong": 1, "answers": 2000}
    record = {"arm": "race", "score": {"wrong": 0, "decided_share": 0.1, "gap": 0.39}}
    lines = scores.goal_lines([record], null, "digits", floor=0.38)
    gap = next(line for line in lines if "gap" in line)
    assert "0.39 -> MISSED (a perfect search scores 0.38 here)" in gap
