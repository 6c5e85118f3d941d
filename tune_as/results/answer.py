"""One answer: the record of what a search decided and how, and the one function that turns runs into its
table.

The search builds an `AnswerRecord` (the verdict plan: baseline, margin, alpha, looks and seeds, the budget's
last look; which trials are results and which confirmation runs belong to which round; why a loss has no
result; the notes it printed), logs it as `answer.json` on its parent run, and prints
`answer_table(record, trials, confirmations)`. The report reads the record back, fetches the same runs from
MLflow and calls the same function: the same runs always give the same verdicts, intervals, marks and best set
(tests/test_report.py checks the report's table against the search's `ranking.csv`). Pure: no Ray, no MLflow.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tune_as.results import noise, racing, ranking, verdicts
from tune_as.results.render import Table
from tune_as.results.selection import TrialRun

VERSION = 1
ALPHA = 0.05  # every search's family-wise level (verdicts and best set together): no option changes it
Mode = Literal["none", "race", "fixed"]


@dataclass(frozen=True)
class AnswerRecord:
    """What the search decided with, enough to replay its answer from its runs.

    trials: Ray trial id -> whether it completed its epochs, for every search trial with a result (trials
    without one are in `failures` or nowhere). rounds: the Ray trial ids of the confirmation runs, round by
    round. race: the verdict plan (None: the answer was not confirmed). notes: the lines printed under the
    table before the verdict notes (data warnings, budget, finite spaces)."""

    task: str
    metric: str
    title: str
    losses: tuple[str, ...]
    baseline: str
    margin_points: float
    mode: Mode
    race: racing.Plan | None
    trials: Mapping[str, bool]
    rounds: tuple[tuple[str, ...], ...] = ()
    failures: Mapping[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def alpha(self) -> float:
        return self.race.alpha if self.race is not None else ALPHA

    def disagreement(self, params: Mapping[str, str]) -> str | None:
        """What in this record contradicts the search's own parent-run params
        (tune_as.engine.record.parent_params), one line naming the field, or None: a record is data to check
        before it is replayed, never trusted."""
        checks: list[tuple[str, str, object, object]] = [
            ("baseline", "baseline", self.baseline, params.get("baseline")),
            ("losses", "losses", ",".join(self.losses), params.get("losses"))]
        if "margin_points" in params:
            checks.append(("margin_points", "margin_points", self.margin_points,
                           float(params["margin_points"])))
        race = self.race
        if race is not None:
            checks += [("race.baseline", "baseline", race.baseline, params.get("baseline")),
                       ("race.margin_points", "margin_points", race.margin_points, self.margin_points)]
            if "noise" in params:
                checks.append(("race.noise", "noise", race.noise, params["noise"]))
            if self.mode == "race" and "max_seeds" in params and race.max_seeds > int(params["max_seeds"]):
                return (f"race.max_seeds: expected at most the search's --max-seeds {params['max_seeds']}, "
                        f"received {race.max_seeds}")
            # 0: confirmed after the fact (--resume)
            if self.mode == "fixed" and params.get("confirm", "0") != "0":
                checks.append(("race.max_seeds", "confirm", race.max_seeds, int(params["confirm"])))
        for field_name, param, mine, theirs in checks:
            if theirs is not None and mine != theirs:
                return f"{field_name}: expected the search's {param} {theirs!r}, received {mine!r}"
        return None

    def to_json(self) -> str:
        body: dict[str, Any] = {"version": VERSION,
                                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        body["race"] = None if self.race is None else dataclasses.asdict(self.race)
        return json.dumps(body, indent=1, sort_keys=True, default=list) + "\n"

    @classmethod
    def from_json(cls, text: str) -> AnswerRecord:
        """The record back from `to_json`'s text; ValueError naming what is wrong (a damaged or foreign
        file)."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(
                f"expected the JSON of an answer record, received unreadable text ({exc})") from None
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            got = raw.get("version") if isinstance(raw, dict) else type(raw).__name__
            raise ValueError(f"expected an answer record of version {VERSION}, received {got!r}")
        kinds: dict[str, Any] = {"task": str, "metric": str, "title": str, "losses": list, "baseline": str,
                                 "margin_points": (int, float), "mode": str, "race": (dict, type(None)),
                                 "trials": dict, "rounds": list, "failures": dict, "notes": list}
        for key, kind in kinds.items():
            if not isinstance(raw.get(key), kind) or isinstance(raw.get(key), bool):
                raise ValueError(f"answer record: expected {key!r} of type {kind}, "
                                 f"received {raw.get(key)!r:.80}")
        if raw["mode"] not in ("none", "race", "fixed"):
            raise ValueError(f"answer record: expected mode none, race or fixed, received {raw['mode']!r}")
        race = None
        if raw["race"] is not None:
            # a record from before the noise model and the spending were recorded was decided per-loss,
            # alpha by n
            plan = {"noise": "per-loss", "spending": "n", **raw["race"]}
            race = racing.Plan(**{**plan, "losses": tuple(plan.get("losses", ())),
                                  "seeds": tuple(plan.get("seeds", ()))})
            if race.alpha != ALPHA:  # the search has no option for it: any other value is not the search's
                raise ValueError(f"answer record: race.alpha: expected {ALPHA} (the search's family-wise "
                                 f"level), received {race.alpha!r}")
        return cls(raw["task"], raw["metric"], raw["title"], tuple(map(str, raw["losses"])), raw["baseline"],
                   float(raw["margin_points"]), raw["mode"], race,
                   {str(k): bool(v) for k, v in raw["trials"].items()},
                   tuple(tuple(map(str, r)) for r in raw["rounds"]),
                   {str(k): str(v) for k, v in raw["failures"].items()}, tuple(map(str, raw["notes"])))


@dataclass(frozen=True)
class Answered:
    """The answer as printed: its rows, its table, and the race's decision (None when not confirmed)."""

    rows: list[ranking.Row]
    table: Table
    decision: racing.Answer | None

    def render(self, fmt: str, record: AnswerRecord | None = None) -> str:
        """The answer in one of render.FORMATS; "json" is the structured answer (`structured`) when the record
        is given, numbers as numbers."""
        return (json.dumps(structured(self, record), indent=1, ensure_ascii=False) + "\n"
                if fmt == "json" and record is not None else self.table.render(fmt))


def answer_table(record: AnswerRecord, trials: Sequence[TrialRun],
                 confirmations: Sequence[TrialRun]) -> Answered:
    """The answer from the runs the record names: the race replayed with `racing.decide` on the confirmation
    runs, rows by `ranking.rank`, the table and its notes. Runs the record does not name are ignored; a named
    run that is missing leaves its seed out (the replay then says what the runs allow, as the search
    would)."""
    mine = [r for r in trials if r.run_id in record.trials]
    named = {run_id for round_ids in record.rounds for run_id in round_ids}
    confirmed = [r for r in confirmations if r.run_id in named]
    results = ranking.race_results(confirmed, record.metric)
    decision = None if record.race is None else racing.decide(results, record.race, 0)
    rows = ranking.rank(mine, confirmed, record.metric, record.losses, decision, record.race, record.failures)
    notes = [*record.notes, *_verdict_notes(record, decision, rows)]
    if record.race is not None and decision is not None:
        notes += _what_it_takes(record.race, decision, results)
    table = ranking.table(rows, record.title, record.baseline, record.margin_points, record.alpha, notes)
    return Answered(rows, table, decision)


def _what_it_takes(plan: racing.Plan, decision: racing.Answer, results: racing.Results) -> list[str]:
    """For every undecided loss, the seeds a fixed design would need at its observed difference and spread
    (racing.seeds_to_decide), or why no number of seeds would decide it."""
    on = 0 if decision.metric == "val" else 1
    base = {s: v[on] for s, v in results.get(plan.baseline, {}).items()}
    parts, needs = [], []
    for row in decision.rows:
        if row.verdict != "undecided" or row.mean_diff is None:
            continue
        used = plan.seeds[: decision.seeds_used.get(row.loss, 0)]
        mine = {s: v[on] for s, v in results.get(row.loss, {}).items() if s in used}
        d = verdicts.paired_differences(
            {s: float(v) for s, v in mine.items() if v is not None},
            {s: float(v) for s, v in base.items() if v is not None})
        own = float(np.std(d, ddof=1)) if len(d) > 1 else 0.0
        # the larger of its own spread (the gate's) and the one its test used (the noise model's)
        sd = max(own, row.sd or 0.0) if own > 0 else 0.0
        n = racing.seeds_to_decide(plan, row.mean_diff, sd)
        needs += [n] if n is not None else []
        parts.append(f"{row.loss} ≈ {n} seeds" if n is not None else f"{row.loss}: not within 100 seeds" + (
            " (equal values on every seed so far)" if sd == 0 else f" at Δ {100 * row.mean_diff:+.2f}"))
    if not parts:
        return []
    more = (f" This answer cannot take more seeds (its looks and error control were fixed before its first "
            f"seed): a new search with --race --max-seeds {max(3, *needs)} asks for them." if needs else "")
    return ["What would decide the undecided (a fixed design of n new seeds at each loss's observed Δ and "
            "spread, Holm's first step; an estimate that new seeds will move): "
            + "; ".join(parts) + "." + more]


def _verdict_notes(record: AnswerRecord, decision: racing.Answer | None,
                   rows: Sequence[ranking.Row]) -> list[str]:
    """What the verdicts and the best set claim, at which look each claim was made, and what is not
    claimed."""
    plan = record.race
    if plan is None or decision is None:
        return []
    notes = []
    if decision.leader is not None:
        tied = sorted(decision.best)
        members = (f"{', '.join(tied)}; its members are tied, not ranked" if len(tied) > 1
                   else f"{tied[0]} alone")
        notes.append(f"Best set on validation (Hsu's multiple comparisons with the best): {members}. A truly "
                     f"best loss is in it with probability >= {1 - plan.alpha / 2:.1%}; when several losses "
                     "tie for best, each is kept with that probability, not all of them together.")
    looks = {look.index: look for look in decision.looks}
    made: dict[int, list[str]] = {}
    for row in decision.rows:
        if row.decided_at is not None:
            made.setdefault(row.decided_at, []).append(f"{row.loss} {row.verdict}")
    when = "; ".join(f"look {k} ({looks[k].n} seeds): {', '.join(claims)}"
                     for k, claims in sorted(made.items()))
    notes.append(f"Verdicts (win, loss, equivalent within ±{plan.margin_points:g} points) are controlled "
                 f"together at a family-wise error of {plan.alpha / 2:.1%} over every comparison printed and "
                 f"every look (Holm's step-down; looks at {', '.join(map(str, plan.looks))} seeds, "
                 f"{len(decision.looks)} taken); with the best set's {plan.alpha / 2:.1%}, any claim of this "
                 f"answer is wrong with probability <= {plan.alpha:.0%}. "
                 + (f"Claims made at {when}." if when else "No claim was made."))
    notes.append(_noise_note(plan, decision))
    last = decision.looks[-1] if decision.looks else None
    if last is not None:
        m = len(decision.rows)
        level = 1 - 2 * last.alpha_verdicts / (3 * m)
        source = "each loss's seeds" if plan.noise == "per-loss" else "the noise model"
        notes.append(f"Intervals: t intervals from {source} at level {level:.3%} each, simultaneous over the "
                     f"{m} comparisons at >= {1 - 2 * last.alpha_verdicts / 3:.2%} "
                     "(Bonferroni, at the last look); "
                     + (f"never narrower than one item of the split (±{plan.resolution_points:.3g} points). "
                        if plan.resolution_points else "")
                     + "Equal values on every seed are no evidence: such a loss stays undecided.")
    notes.append(f"Every claim is about training seeds on this {decision.metric} split: another split or "
                 "another task may differ.")
    marked = [r for r in rows if r.verdict.endswith(verdicts.STEP_DOWN_MARK)]
    if marked:
        by_loss = {r.loss: r for r in decision.rows}
        reasons = []
        for r in marked:
            c = by_loss[r.loss]
            at = looks.get(c.decided_at or 0)
            earlier = at is not None and at.n < c.n
            reasons.append(f"{r.loss}: made at look {c.decided_at}"
                           + (f" on {at.n} seeds, the interval is on {c.n}" if earlier and at else "")
                           + (" by Holm's step-down, which tests at a looser level once other claims are made"
                              if not earlier else ""))
        notes.append(f"{verdicts.STEP_DOWN_MARK}: the interval shown reaches past the claim "
                     f"({'; '.join(reasons)}); the claim is controlled as stated above (docs/verdicts.md).")
    return notes


def _noise_note(plan: racing.Plan, decision: racing.Answer) -> str:
    """The verdicts' noise model: its name, what it assumed, its degrees of freedom, and every look where a
    check took a loss (or the baseline, and with it every comparison) out of it."""
    if plan.noise == "per-loss":
        return ("Noise: per-loss (each comparison's own paired spread, n - 1 degrees of freedom; --noise "
                "moderated borrows strength across losses).")
    rule = noise.RULES[plan.noise]
    dfs = [r.df for r in decision.rows if r.df is not None and r.decided_at is None]
    dfs = dfs or [r.df for r in decision.rows if r.df is not None]
    said = [f"Noise: {plan.noise} (docs/verdicts.md, section 12): every loss ran on the same seeds, so each "
            f"loss's seed-to-seed noise is read from its own runs and, with a prior weight of at most "
            f"{rule.prior_df:g} degrees of freedom, from the other losses'"
            + (f"; each claim also passed its own paired t-test at {rule.gate:g} x its look's alpha"
               if rule.gate else "") + "."]
    if dfs:
        said.append(f"Degrees of freedom of the comparisons shown: {min(dfs):.3g}-{max(dfs):.3g}"
                    if min(dfs) != max(dfs) else f"Degrees of freedom of the comparisons shown: {dfs[0]:.3g}")
    falls = []
    for look in decision.looks:
        if look.pool_df == 0:
            falls.append(f"look {look.index}: too few losses to pool, every comparison on its own spread")
        elif plan.baseline in look.out_of_line:
            falls.append(f"look {look.index}: the baseline {plan.baseline} out of line, every comparison on "
                         "its own spread")
        elif look.out_of_line:
            falls.append(f"look {look.index}: {', '.join(look.out_of_line)} out of line, on "
                         f"{'their' if len(look.out_of_line) > 1 else 'its'} own spread")
    said.append("Checks: " + "; ".join(falls) if falls else "No loss was out of line")
    return "; ".join(said[:1]) + " " + ". ".join(said[1:]) + "."


def summary(answered: Answered, margin_points: float) -> tuple[dict[str, float], dict[str, str]]:
    """The answer as MLflow metrics and tags of the parent run (names: tune_as.tracking.schema), so the runs
    table shows it: per loss its difference to the baseline and interval bounds in points, its verdict word;
    the best set, and the winner when the best set has one member ("tie" otherwise)."""
    decision = answered.decision
    if decision is None:
        return {}, {}
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    for row in decision.rows:
        if row.mean_diff is not None:
            metrics[f"delta_{row.loss}"] = 100 * row.mean_diff
        if row.interval is not None:
            metrics[f"delta_low_{row.loss}"], metrics[f"delta_high_{row.loss}"] = (
                100 * x for x in row.interval)
        tags[f"verdict.{row.loss}"] = verdicts.verdict_word(row, verdicts.points(margin_points))
    if decision.best:
        tags["best_set"] = ", ".join(sorted(decision.best))
        tags["winner"] = decision.best[0] if len(decision.best) == 1 else "tie: " + tags["best_set"]
    return metrics, tags


def _stats(values: Sequence[float]) -> dict[str, Any] | None:
    """Values of the metric (fractions) in points: their mean, standard deviation (None for one) and each."""
    if not values:
        return None
    pts = [100 * v for v in values]
    return {"mean": float(np.mean(pts)), "std": float(np.std(pts, ddof=1)) if len(pts) > 1 else None,
            "values": pts}


def structured(answered: Answered, record: AnswerRecord) -> dict[str, Any]:
    """The answer for scripts (`--format json`): per loss, in the table's order, its exact setting, trials,
    validation and test in points (mean, std, per seed), and against the baseline the difference and its
    simultaneous interval in points, the adjusted p, the verdict (win, loss, equivalent, undecided), whether
    the interval shows it (else Holm's step-down made it: the table's mark) and the look that decided it;
    the best set; the notes. The same runs give the same document (it is built from the replayed answer)."""
    decision = answered.decision
    margin = verdicts.points(record.margin_points)
    rows = []
    tied = sum(row.best for row in answered.rows) > 1  # the best set's members share rank 1, as in the table
    for rank, row in enumerate(answered.rows, 1):
        comparison = next((c for c in decision.rows if c.loss == row.loss), None) if decision else None
        rows.append({
            "rank": (1 if row.best and tied else rank) if row.val else None, "loss": row.loss,
            "setting": row.setting, "trials": row.trials,
            "completed": row.completed, "confirmed": row.confirmed,
            "seeds": len(row.val) if row.confirmed else 0,
            "val_points": _stats(row.val), "test_points": _stats(row.test),
            "baseline": row.loss == record.baseline,
            "diff_points": None if comparison is None or comparison.mean_diff is None
            else 100 * comparison.mean_diff,
            "interval_points": None if comparison is None or comparison.interval is None
            else [100 * x for x in comparison.interval],
            "p_adjusted": None if comparison is None else comparison.p_adjusted,
            "verdict": None if comparison is None else comparison.verdict,
            "interval_shows_verdict": (None if comparison is None
                                       else verdicts.interval_shows(comparison, margin)),
            "decided_at_look": None if comparison is None else comparison.decided_at,
            "best_set": row.best, "failure": row.failure or None})
    return {"task": record.task, "title": record.title, "metric": record.metric, "baseline": record.baseline,
            "margin_points": record.margin_points, "alpha": record.alpha,
            "verdicts_on": decision.metric if decision else None,
            "best_set": sorted(decision.best) if decision else [], "losses": rows,
            "notes": answered.table.notes}

