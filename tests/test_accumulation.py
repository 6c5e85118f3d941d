"""AS-Speed accumulation (Eq. 19 and its three restrictions) on hand-built sequences of masked counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tune_as.losses import build_loss
from tune_as.losses.accumulation import AdaptiveAccumulation


def run(acc: AdaptiveAccumulation, cycles: list[tuple[int, int]]) -> list[int]:
    """Observe one micro-batch (n_rows, n_masked) per cycle; the steps chosen at each next cycle start."""
    steps = []
    for n_rows, n_masked in cycles:
        acc.observe(n_rows, n_masked)
        steps.append(acc.cycle_start())
    return steps


def test_starts_without_accumulation_and_follows_lambda() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=8)
    assert acc.steps == 1
    # lam * N / (N - N_masked): 32/32 -> 1, 32/16 -> 2, 32/8 -> 4 (but at most +1 per cycle)
    assert run(acc, [(32, 0), (32, 16), (32, 24), (32, 24), (32, 24)]) == [1, 2, 3, 4, 4]


def test_lambda_scales_the_target_and_rounds_half_to_even() -> None:
    assert run(AdaptiveAccumulation(lam=0.5, max_steps=8), [(32, 16)] * 3) == [1, 1, 1]  # 0.5 * 2 = 1
    assert run(AdaptiveAccumulation(lam=1.5, max_steps=8), [(10, 0)] * 3) == [2, 2, 2]  # round(1.5) = 2
    assert run(AdaptiveAccumulation(lam=2.5, max_steps=8), [(10, 0)] * 4) == [2, 2, 2, 2]  # round(2.5) = 2
    assert run(AdaptiveAccumulation(lam=0.1, max_steps=8), [(10, 9)] * 2) == [1, 1]  # round(1.0)
    assert run(AdaptiveAccumulation(lam=0.01, max_steps=8), [(10, 0)]) == [1]  # never below 1


def test_never_decreases_rises_by_one_and_is_capped() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=3)
    steps = run(acc, [(10, 9), (10, 9), (10, 0), (10, 9), (10, 9), (10, 9), (10, 0)])
    assert steps == [2, 3, 3, 3, 3, 3, 3]


def test_all_observations_of_a_cycle_count_not_only_the_last() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=8)
    acc.observe(10, 10)
    acc.observe(30, 0)  # 40 rows, 10 masked: 40 / 30 -> 1
    assert acc.cycle_start() == 1
    acc.observe(10, 0)
    acc.observe(10, 10)  # 20 rows, 10 masked: 2
    assert acc.cycle_start() == 2


def test_every_row_masked_rises_without_dividing_by_zero() -> None:
    acc = AdaptiveAccumulation(lam=0.5, max_steps=2)
    acc.observe(16, 16)  # Eq. 19 is infinite: previous + 1
    assert acc.cycle_start() == 2
    acc.observe(16, 16)
    assert acc.cycle_start() == 2  # capped


def test_no_observation_keeps_steps() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=5)
    run(acc, [(10, 5)])
    assert acc.cycle_start() == 2 and acc.cycle_start() == 2
    acc.observe(0, 0)  # every token of the micro-batch was ignore_index
    assert acc.cycle_start() == 2


def test_accepts_loss_output_tensors() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=5)
    acc.observe(torch.tensor(8), torch.tensor(6))
    acc.observe(torch.tensor(8), torch.tensor(6))
    assert acc.cycle_start() == 2  # 16 rows, 12 masked: Eq. 19 asks 4, at most previous + 1


def test_state_dict_resumes_exactly() -> None:
    sequence = [(10, 3), (10, 8), (10, 9), (10, 2), (10, 9), (10, 9)]
    full = run(AdaptiveAccumulation(lam=1.2, max_steps=6), sequence)
    first = AdaptiveAccumulation(lam=1.2, max_steps=6)
    assert run(first, sequence[:3]) == full[:3]
    first.observe(*sequence[3])  # checkpointed in the middle of a cycle
    resumed = AdaptiveAccumulation(lam=1.2, max_steps=6)
    resumed.load_state_dict(first.state_dict())
    assert resumed.steps == first.steps == full[2]
    assert [resumed.cycle_start()] + run(resumed, sequence[4:]) == full[3:]
    with pytest.raises(ValueError, match="checkpoint has lam=1.2, max_steps=6"):
        AdaptiveAccumulation(lam=0.5, max_steps=6).load_state_dict(first.state_dict())


@pytest.mark.parametrize(
    ("lam", "max_steps", "message"),
    [
        (0.0, 2, "lam must be in (0, 16], got 0.0"),
        (float("inf"), 2, "lam must be in (0, 16], got inf"),
        (16.5, 2, "lam must be in (0, 16], got 16.5"),
        (1.0, 0, "max_steps must be an integer in [1, 64], got 0"),
        (1.0, 65, "max_steps must be an integer in [1, 64], got 65"),
        (1.0, 2.5, "max_steps must be an integer in [1, 64], got 2.5"),
    ],
)
def test_rejects_bad_hyper_parameters(lam: float, max_steps: int, message: str) -> None:
    """One definition of the ranges: the accumulator and the as_speed loss reject the same values alike."""
    for make in (lambda: AdaptiveAccumulation(lam, max_steps),
                 lambda: build_loss("as_speed", lam=lam, max_steps=max_steps)):
        with pytest.raises(ValueError) as err:
            make()
        assert message in str(err.value)


def test_rejects_more_masked_than_rows() -> None:
    acc = AdaptiveAccumulation(lam=1.0, max_steps=2)
    acc.observe(4, 5)
    with pytest.raises(ValueError, match="n_masked must be in"):
        acc.cycle_start()


@settings(max_examples=200, deadline=None)
@given(
    lam=st.floats(0.05, 4.0),
    max_steps=st.integers(1, 6),
    cycles=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)).map(lambda c: (c[0], min(c))),
                    max_size=25),
)
def test_restrictions_hold_on_any_sequence(lam: float, max_steps: int, cycles: list[tuple[int, int]]) -> None:
    acc = AdaptiveAccumulation(lam, max_steps)
    previous = acc.steps
    for n_rows, n_masked in cycles:
        acc.observe(n_rows, n_masked)
        steps = acc.cycle_start()
        assert previous <= steps <= min(previous + 1, max_steps) and steps >= 1  # (i), (ii), (iii)
        if n_rows:  # the target of Eq. 19 is reached whenever the restrictions allow it
            wanted = round(lam * n_rows / (n_rows - n_masked)) if n_masked < n_rows else max_steps
            assert steps == max(1, min(max(wanted, previous), previous + 1, max_steps))
        previous = steps
