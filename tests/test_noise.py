"""tune_as.results.noise and the moderated verdicts: the model's estimates, its checks, its gate, its error
under a heteroscedastic null (against the pooled rule, which the same test catches), and a moderated answer
replayed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tune_as.results import noise, racing
from tune_as.results.answer import AnswerRecord, answer_table
from tune_as.results.selection import TrialRun
from tune_as.results.verdicts import compare_with_baseline, model_of

LOSSES = ("softmax", *(f"l{i:02d}" for i in range(1, 13)))
POOLS = Path(__file__).resolve().parent.parent / "benchmarks" / "digits_pools.json"


def block(rng: np.random.Generator, sd: list[float], n: int, effect: list[float] | None = None) -> np.ndarray:
    """losses x seeds: 0.9 + effect + a seed effect shared by every loss + each loss's own noise."""
    seed = rng.normal(0.0, 0.01, n)
    return np.array([0.9 + (effect[i] if effect else 0.0) + seed + rng.normal(0.0, s, n)
                     for i, s in enumerate(sd)])


def values(x: np.ndarray, names: tuple[str, ...] = LOSSES) -> dict[str, dict[int, float]]:
    return {name: {s: float(v) for s, v in enumerate(row)} for name, row in zip(names, x, strict=True)}


def test_the_model_reads_each_losss_own_variance_from_the_block() -> None:
    """On 400 seeds the two-way fit recovers every loss's noise variance (the baseline's too, from its own
    runs), whatever the seed effect; the moderation toward the pool is then negligible. There a loss 2-4x
    noisier than the median is plainly out of line: it leaves the pool and keeps its own estimate."""
    sd = [0.004, *np.linspace(0.002, 0.008, 12)]
    model = noise.fit(block(np.random.default_rng(0), sd, 400), LOSSES, "softmax")
    assert set(model.out_of_line) == {"l08", "l09", "l10", "l11", "l12"}
    assert model.pool_df == 6 * 399 and model.pooled == {"softmax", *(f"l{i:02d}" for i in range(1, 8))}
    np.testing.assert_allclose(np.sqrt(model.var), sd, rtol=0.12)
    v, df = model.difference("l12", "softmax")
    assert v == pytest.approx(model.var[12] + model.var[0]) and \
        df == pytest.approx(min(model.df[12], model.df[0]))


def test_the_prior_weight_is_capped_with_equal_noise_and_falls_with_unequal_noise() -> None:
    rng = np.random.default_rng(1)
    nu = np.full(12, 4.0)
    equal = [noise.prior_weight(0.01 * rng.chisquare(4, 12) / 4, nu, 4.0) for _ in range(200)]
    spread = [noise.prior_weight(np.geomspace(0.01, 1.0, 12) * rng.chisquare(4, 12) / 4, nu, 4.0)
              for _ in range(200)]
    assert np.median(equal) == 4.0 and max(equal) == 4.0
    assert np.median(spread) < 2.0
    assert noise.prior_weight(np.ones(2), np.full(2, 4.0), 4.0) == 4.0, "fewer than 3 variances: the cap"


def test_a_diverged_run_is_out_of_line_and_its_comparisons_take_their_own_spread() -> None:
    x = block(np.random.default_rng(2), [0.005] * 13, 5)
    x[3, 1] = 0.1  # chance accuracy on one seed
    model = noise.fit(x, LOSSES, "softmax")
    assert model.out_of_line == ("l03",)
    assert not model.usable("l03", "softmax") and model.usable("l04", "softmax")
    x[0, 2] = 0.1  # now the baseline: every comparison takes its own spread
    model = noise.fit(x, LOSSES, "softmax")
    assert "softmax" in model.out_of_line and not any(model.usable(name, "softmax") for name in LOSSES[1:])


def test_too_few_losses_to_pool_is_the_per_loss_rule() -> None:
    """With one loss beside the baseline there is nothing to borrow: the moderated verdict is the per-loss
    one."""
    x = block(np.random.default_rng(3), [0.005, 0.005], 5, [0.0, 0.01])
    v = values(x, ("softmax", "a"))
    model = model_of(v, "softmax")
    assert model.pool_df == 0
    assert compare_with_baseline(v, "softmax", 0.005, 0.025, model=model) == compare_with_baseline(
        v, "softmax", 0.005, 0.025)


def test_the_model_decides_what_the_per_loss_rule_cannot_and_the_gate_holds_a_noisy_loss_back() -> None:
    """Three seeds, 13 losses of equal noise, l01 four points better: the per-loss rule (2 degrees of freedom
    at alpha / 36) cannot claim it, the model can. l02 is as far ahead on average but its own seeds disagree
    wildly: the gate (its own paired t-test at a quarter of the alpha) keeps it undecided."""
    rng = np.random.default_rng(4)
    x = block(rng, [0.003] * 13, 3, [0.0, 0.04, 0.0, *[0.0] * 10])
    x[2] = x[0] + np.array([0.10, -0.02, 0.04])  # mean +4 points, own spread 6 points
    v = values(x)
    model = model_of(v, "softmax")
    per_loss = {r.loss: r.verdict for r in compare_with_baseline(v, "softmax", 0.005, 0.025)}
    moderated = {r.loss: r for r in compare_with_baseline(v, "softmax", 0.005, 0.025, model=model)}
    assert per_loss["l01"] == "undecided" and moderated["l01"].verdict == "win"
    assert moderated["l01"].df is not None and moderated["l01"].df > 2
    assert moderated["l02"].verdict == "undecided"


def test_equal_counts_on_a_lattice_are_evidence_under_the_model_never_exact() -> None:
    """A difference of the same whole number of items on every seed: zero own spread. The per-loss rule calls
    that no evidence; under the model the noise is read from every loss, and the gate reads the own spread as
    at least one item of the split, so a large constant difference is a claim and a small one stays open."""
    items = 359
    rng = np.random.default_rng(5)
    x = np.round(block(rng, [0.006] * 13, 5) * items) / items
    x[1] = x[0] + 18 / items  # +5 points on every seed
    x[2] = x[0] + 1 / items  # +0.28 points on every seed
    v = values(x)
    rows = {r.loss: r.verdict for r in compare_with_baseline(v, "softmax", 0.005, 0.025,
                                                             model=model_of(v, "softmax"),
                                                             resolution=1 / items)}
    assert rows["l01"] == "win" and rows["l02"] == "undecided"
    assert {r.loss: r.verdict for r in compare_with_baseline(v, "softmax", 0.005, 0.025)}["l01"] == \
        "undecided"


def _null_error(noise_name: str, answers: int, sd: list[float]) -> tuple[int, int]:
    """README-shaped races (13 losses, looks at 3 and 5 seeds) on a null: (answers with a wrong verdict,
    claims)."""
    plan = racing.Plan(LOSSES, "softmax", tuple(range(5)), max_seeds=5,
                       noise=noise_name)  # type: ignore[arg-type]
    rng = np.random.default_rng(6)
    wrong = claims = 0
    for _ in range(answers):
        val, test = block(rng, sd, 5), block(rng, sd, 5)
        results = {name: {s: (float(val[i, s]), float(test[i, s])) for s in range(5)}
                   for i, name in enumerate(LOSSES)}
        rows = racing.decide(results, plan).rows
        bad = sum(r.verdict in ("win", "loss") for r in rows)
        wrong, claims = wrong + (bad > 0), claims + bad
    return wrong, claims


@pytest.mark.slow
def test_a_heteroscedastic_null_keeps_the_error_and_the_pooled_rule_does_not() -> None:
    """One loss 10x noisier than the others, every loss identical in mean: the moderated rule's family-wise
    error stays within the verdicts' 0.025 (docs/verdicts.md, section 12: 2,000 answers), while one pooled
    variance lends the noisy loss the quiet ones' confidence and makes false claims in far more answers: this
    test fails on it."""
    sd = [0.003, 0.03, *[0.003] * 11]
    answers = 300
    wrong, _ = _null_error("moderated", answers, sd)
    high = stats.binomtest(wrong, answers).proportion_ci(0.95, method="exact").high
    assert wrong / answers <= 0.025 and high <= 0.05, (wrong, high)
    pooled, _ = _null_error("pooled", answers, sd)
    assert pooled / answers > 0.1, pooled


def test_decidable_under_the_model_is_below_the_per_loss_rule_at_every_look() -> None:
    plan = racing.Plan(LOSSES, "softmax", tuple(range(10)), max_seeds=10)
    per_loss = racing.Plan(LOSSES, "softmax", tuple(range(10)), max_seeds=10, noise="per-loss", spending="n")
    ours, theirs = dict(racing.decidable(plan)), dict(racing.decidable(per_loss))
    assert ours.keys() == theirs.keys() == {3, 5, 7, 9, 10}
    assert all(ours[n] < theirs[n] for n in ours), (ours, theirs)


def _runs(pools: dict[str, dict[str, list[float]]], seeds: range) -> list[TrialRun]:
    return [TrialRun(f"{loss}-{s}", "digits", loss, {"loss": loss, "seed": str(s)}, "accuracy",
                     runs[str(s)][0] / 100, {"test_accuracy": runs[str(s)][1] / 100})
            for loss, runs in pools.items() for s in seeds]


def test_a_moderated_answer_replays_byte_for_byte_from_its_record() -> None:
    """The README race's first 5 seeds of real digits runs (benchmarks/digits_pools.json): the answer from the
    record the search logs, read back from its JSON, is the same table to the byte; it names its noise model,
    and the record of an older search (no noise field) replays with the per-loss rule it was decided with."""
    doc = json.loads(POOLS.read_text())
    losses = (doc["baseline"], *sorted(n for n in doc["runs"] if n != doc["baseline"]))
    plan = racing.Plan(losses, doc["baseline"], tuple(range(1, 11)), max_seeds=5, resolution_points=100 / 359)
    confirmations = _runs(doc["runs"], range(1, 6))
    record = AnswerRecord("digits", "accuracy", "digits: which loss wins", losses, doc["baseline"], 0.5,
                          "race", plan, {}, (tuple(r.run_id for r in confirmations),))
    first = answer_table(record, [], confirmations)
    again = answer_table(AnswerRecord.from_json(record.to_json()), [], confirmations)
    assert again.table.markdown() == first.table.markdown() and again.table.csv() == first.table.csv()
    assert first.decision is not None and sum(r.verdict != "undecided" for r in first.decision.rows) >= 4
    assert any(note.startswith("Noise: moderated") for note in first.table.notes)
    old = json.loads(record.to_json())
    del old["race"]["noise"], old["race"]["spending"]
    replayed = AnswerRecord.from_json(json.dumps(old))
    assert replayed.race is not None and (replayed.race.noise, replayed.race.spending) == ("per-loss", "n")
