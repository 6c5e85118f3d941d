"""One answer: the search's record (tune_as.results.answer) read back exactly, and the report replaying a real
race-shaped search (rounds, a loss decided at the first look, a failed loss) to the byte of its
ranking.csv."""

from __future__ import annotations

import csv
import io
import json
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import round_dir
from mlflow import MlflowClient

from tune_as.results import racing, ranking
from tune_as.results.answer import AnswerRecord, answer_table
from tune_as.results.ranking import exact_value
from tune_as.results.selection import TrialRun
from tune_as.results.verdicts import STEP_DOWN_MARK, unmarked
from tune_as.tracking import schema


def record(**changes) -> AnswerRecord:
    plan = racing.Plan(("softmax", "a", "b"), "softmax", (5, 6, 7, 8, 9), max_seeds=5, margin_points=0.5,
                       resolution_points=100 / 359)
    base = dict(task="digits", metric="accuracy", title="digits: which loss wins",
                losses=("softmax", "a", "b", "c"), baseline="softmax", margin_points=0.5, mode="race",
                race=plan, trials={"t0": True, "t1": True, "t2": False}, rounds=(("c0", "c1"), ("c2",)),
                failures={"c": "failed or diverged: nan"}, notes=("Data: a note",))
    return AnswerRecord(**{**base, **changes})


def test_a_record_reads_back_exactly_and_a_damaged_one_says_what_is_wrong() -> None:
    r = record()
    assert AnswerRecord.from_json(r.to_json()) == r
    assert AnswerRecord.from_json(record(race=None, mode="none").to_json()).race is None
    for text, expected in [("{", "unreadable"), ("[]", "version 1"), ('{"version": 2}', "version 1"),
                           (r.to_json().replace('"mode": "race"', '"mode": "best"'),
                            "mode none, race or fixed"),
                           (r.to_json().replace('"trials": {', '"trials": ["x"], "old": {'), "'trials'")]:
        with pytest.raises(ValueError, match=expected):
            AnswerRecord.from_json(text)
    # the plan inside is checked by racing.Plan itself
    with pytest.raises(ValueError, match="max_seeds"):
        AnswerRecord.from_json(r.to_json().replace('"max_seeds": 5', '"max_seeds": 50'))


def run(run_id: str, loss: str, seed: int, val: float, test: float) -> TrialRun:
    return TrialRun(run_id, "digits", loss, {"loss": loss, "seed": str(seed), "lr": "0.003"}, "accuracy", val,
                    {"test_accuracy": test})


def test_the_table_uses_only_the_runs_the_record_names() -> None:
    plan = racing.Plan.fixed(("softmax", "a"), "softmax", (5, 6, 7), 3, resolution_points=100 / 359)
    r = record(losses=("softmax", "a"), race=plan, mode="fixed", trials={"s": True, "x": True},
               rounds=(("s5", "s6", "s7", "a5", "a6", "a7"),), failures={})
    trials = [run("s", "softmax", 0, 0.9, 0.9), run("x", "a", 1, 0.9, 0.9)]
    confirmations = [run(f"s{s}", "softmax", s, 0.9, 0.9) for s in (5, 6, 7)]
    confirmations += [run(f"a{s}", "a", s, 0.9 + s / 1000, 0.956) for s in (5, 6, 7)]
    named = answer_table(r, trials, confirmations)
    stray = answer_table(r, [*trials, run("y", "a", 2, 0.99, 0.99)],
                         [*confirmations, run("a8", "a", 8, 0.1, 0.1)])
    assert stray.table.csv() == named.table.csv(), "a run the record does not name changes nothing"
    rows = {row["loss"]: row for row in csv.DictReader(io.StringIO(named.table.csv()))}
    assert rows["a"]["test mean ± std"] == "95.60 ± 0.00"
    # a constant +5.6 points on every seed is no evidence, and its interval is one test item wide at least
    assert rows["a"]["verdict (Holm, family-wise 2.5%, margin ±0.5 pts)"] == "undecided (3 seeds)"
    step = 100 / 359
    assert rows["a"][next(k for k in rows["a"] if k.startswith("Δ"))] == \
        f"+5.60 [{5.6 - step:+.2f}, {5.6 + step:+.2f}]"


def test_settings_print_as_they_reproduce_the_run() -> None:
    assert [exact_value(v) for v in ("1.0001", "0.30000000000000004", "1e-05", "32", "abc")] == [
        "1.0001", "0.30000000000000004", "1e-05", "32", "abc"]


RACE_SPACE = """task: digits
trials_per_loss: 1
fixed: {epochs: 2, batch_size: 32, lr: 1.0e-2}
losses:
  softmax: {}
  label_smoothing:
    fixed: {eps: 0.1}
  sparsemax:
    fixed: {lr: 1.0e-7}
  am_softmax:
    fixed: {lr: 1.0e+9}
"""


def _answers(report) -> dict[str, list[list[str]]]:
    return {t.name: t.rows for t in report.tables if t.name.startswith("answer_")}


@pytest.mark.slow
def test_a_race_is_reproducible_replayed_exactly_and_never_pooled(tmp_path: Path, mlflow_server,
                                                                          ray_local) -> None:
    """A race in rounds: sparsemax (lr 1e-7 cannot learn) is decided `loss` at the first look on 3 seeds and
    leaves the race, label_smoothing goes on to 5 seeds, am_softmax (lr 1e9) diverges and has no result. Run
    again with two trials at a time, it prints the same table (each trial is seeded and runs on its own CPU;
    the answer is a pure function of the runs). The report of that search prints its answer byte for byte as
    the search logged it (ranking.csv). A second search of the same experiment is a second answer and a second
    column, never pooled with the first."""
    from tune_as.engine import SearchRequest
    from tune_as.engine.run import run_search
    from tune_as.report.build import build_report

    space = tmp_path / "digits.yaml"
    space.write_text(RACE_SPACE)
    experiment = f"answer-{uuid.uuid4().hex[:6]}"
    common = dict(task="digits", search_space=space, mlflow_uri=mlflow_server.uri, experiment=experiment,
                  storage_path=tmp_path / "results", cache_dir=tmp_path / "cache", max_train_samples=600,
                  verbose=0)
    outcome = run_search(SearchRequest(**common, name="race", race=True, max_seeds=5, max_concurrent=1))
    # the same race with two trials at a time (they finish in another order): the same table, byte for byte
    again = run_search(SearchRequest(**{**common, "experiment": f"{experiment}-again"}, name="race-again",
                                     race=True, max_seeds=5, max_concurrent=2))
    assert again.markdown == outcome.markdown
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'")
    logged = Path(client.download_artifacts(parent.info.run_id, schema.RANKING_CSV,
                                            str(tmp_path))).read_text()
    rows = {row["loss"]: row for row in csv.DictReader(io.StringIO(logged))}
    verdict = next(k for k in rows["softmax"] if k.startswith("verdict"))
    assert unmarked(rows["sparsemax"][verdict]) == "loss"
    assert rows["am_softmax"]["selected setting"].startswith("no result: failed or diverged")
    assert rows["label_smoothing"]["test mean ± std"] != "-"
    assert parent.data.params["race"] == "True" and parent.data.params["margin_points"] == "0.5"
    # MLflow opens on the runs table, and the parent run holds the answer as tags and metrics
    assert exp.tags[schema.EXPERIMENT_KIND] == schema.MODEL_RUNS
    tags, metrics = parent.data.tags, parent.data.metrics
    assert unmarked(tags["tune_as.verdict.sparsemax"]) == "loss" and metrics["delta_sparsemax"] < -10
    assert metrics["delta_low_sparsemax"] < metrics["delta_sparsemax"] < metrics["delta_high_sparsemax"]
    assert tags["tune_as.verdict.label_smoothing"] == unmarked(rows["label_smoothing"][verdict])
    assert "sparsemax" not in tags["tune_as.best_set"] and tags["tune_as.winner"]
    assert tags[schema.NOTE] == outcome.markdown, \
        "the parent run's Description in the UI is the answer's table"
    # confirmation runs are named by the seed they confirm: every run name of the search is unique
    names = [r.info.run_name for r in client.search_runs([exp.experiment_id],
                                                         f"tags.`{schema.SEARCH}` = 'race'")]
    assert len(names) == len(set(names)) and "softmax_seed5" in names

    report = build_report([experiment], tmp_path / "out", mlflow_server.uri)
    answers = _answers(report)
    assert list(answers) == ["answer_race"]
    replayed = next(t for t in report.tables if t.name == "answer_race")
    assert replayed.csv() == logged, "the report prints the search's own answer, byte for byte"
    assert not [n for n in report.notes if "differs" in n]
    assert "look 1 (3 seeds): sparsemax loss" in " ".join(replayed.notes)

    # a second search of the same experiment: two answers, two columns, nothing pooled
    run_search(SearchRequest(**common, name="fixed", losses=("softmax", "label_smoothing"), confirm=2,
                             max_epochs=1.0))
    both = build_report([experiment], tmp_path / "both", mlflow_server.uri)
    assert sorted(_answers(both)) == ["answer_fixed", "answer_race"]
    assert next(t for t in both.tables if t.name == "answer_race").csv() == logged
    table6 = next(t for t in both.tables if t.name == "table6")
    assert table6.header[1:] == ["digits@fixed", "digits@race"]
    one = build_report([experiment], tmp_path / "one", mlflow_server.uri, searches=["fixed"])
    assert list(_answers(one)) == ["answer_fixed"]
    assert next(t for t in one.tables if t.name == "table6").header[1:] == ["digits"]


def test_a_step_down_claim_is_marked_and_the_note_says_which_look_made_it() -> None:
    """Three clear losses are rejected first, so x's H_loss is tested at a looser level than its interval: the
    word carries the mark, and the note says the claim was made at look 1 by Holm's step-down; an unmarked
    answer has no such note. The note also says what is controlled and what is not."""
    seeds = (10, 11, 12, 13, 14)
    values = {"softmax": [0.80] * 5, **{name: [0.70 + 0.001 * ((s * 7 + i) % 3) for s in range(5)]
                                        for i, name in enumerate("abc")},
              "x": list(0.80 + np.array([-0.01, -0.0036, -0.0148, -0.0076, -0.014]))}
    plan = racing.Plan.fixed(tuple(values), "softmax", seeds, 5, alpha=0.1)
    trials = [run(f"t{loss}", loss, 0, 0.8, 0.8) for loss in values]
    confirmations = [run(f"{loss}{s}", loss, s, v, v)
                     for loss, vs in values.items() for s, v in zip(seeds, vs, strict=True)]
    r = record(losses=tuple(values), race=plan, mode="fixed", trials={t.run_id: True for t in trials},
               rounds=(tuple(c.run_id for c in confirmations),), failures={}, notes=())
    answered = answer_table(r, trials, confirmations)
    words = {row[1]: row[7] for row in answered.table.rows}
    assert words["x"] == "loss" + STEP_DOWN_MARK and words["a"] == "loss"
    notes = " ".join(answered.table.notes)
    assert f"{STEP_DOWN_MARK}: the interval shown reaches past the claim (x: made at look 1 by Holm's " \
           "step-down" in notes
    assert "Claims made at look 1 (5 seeds): a loss, b loss, c loss, x loss." in notes
    assert "family-wise error of 5.0%" in notes and "softmax alone" in notes
    assert "training seeds on this test split" in notes
    plain = answer_table(record(losses=("softmax", "a"),
                                race=racing.Plan.fixed(("softmax", "a"), "softmax", seeds, 5),
                                mode="fixed", trials={"tsoftmax": True, "ta": True}, rounds=(tuple(
                                    c.run_id for c in confirmations if c.loss in ("softmax", "a")),),
                                failures={}),
                         trials, confirmations)
    assert not any(n.startswith(STEP_DOWN_MARK) for n in plain.table.notes)
    # for scripts: the same answer as JSON, numbers as numbers, the mark as a field of its own
    doc = json.loads(answered.render("json", r))
    by_loss = {row["loss"]: row for row in doc["losses"]}
    assert by_loss["x"]["verdict"] == "loss" and by_loss["x"]["interval_shows_verdict"] is False
    assert by_loss["a"]["interval_shows_verdict"] is True and by_loss["a"]["decided_at_look"] == 1
    assert by_loss["x"]["test_points"]["values"] == pytest.approx(100 * np.array(values["x"]))
    assert by_loss["x"]["diff_points"] == pytest.approx(100 * (np.mean(values["x"]) - 0.80))
    assert by_loss["softmax"]["baseline"] and by_loss["softmax"]["verdict"] is None
    assert doc["alpha"] == 0.1
    assert [row["loss"] for row in doc["losses"]] == [row[1] for row in answered.table.rows]
    assert answered.render("csv", r) == answered.table.csv(), "the other formats are the table's"


@pytest.mark.slow
def test_the_report_replays_a_clinc_oos_race_and_its_raised_margin(tmp_path: Path, mlflow_server,
                                                                   ray_local) -> None:
    """A clinc_oos race on the real data (--smoke: 128 test items, one item = 0.78 points): the default margin
    of 0.5 points cannot be measured there, so it is raised to one item and the answer says so; the report
    prints that answer exactly."""
    from conftest import shared_data

    from tune_as.engine import SearchRequest
    from tune_as.engine.run import run_search
    from tune_as.report.build import build_report

    experiment = f"answer-clinc-{uuid.uuid4().hex[:6]}"
    outcome = run_search(SearchRequest(
        task="clinc_oos", data_dir=shared_data("clinc_oos"), losses=("softmax", "as_softmax"),
        trials_per_loss=1, smoke=True, race=True, max_seeds=3, storage_path=tmp_path / "results",
        mlflow_uri=mlflow_server.uri, experiment=experiment, cache_dir=tmp_path / "cache", max_concurrent=2,
        verbose=0, asha=False))
    assert "the default 0.5 points is less than one item of the test split; equivalence is judged within " \
           "±0.781" in outcome.markdown
    assert "margin ±0.78125 pts" in outcome.markdown
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'")
    logged = Path(client.download_artifacts(parent.info.run_id, schema.RANKING_CSV,
                                            str(tmp_path))).read_text()
    report = build_report([experiment], tmp_path / "out", mlflow_server.uri)
    (answer,) = [t for t in report.tables if t.name.startswith("answer_")]
    assert answer.csv() == logged


@pytest.mark.slow
def test_a_race_with_populations_gives_the_answer_of_one_seed_per_trial(tmp_path: Path, mlflow_server,
                                                                       ray_local) -> None:
    """The same race twice on frozen features, the second with its confirmation seeds trained 3 to a trial
    (populations, tune_as.training.population): the members are the solo trials of their seeds, so the answer
    is the same, each member is a child run of its own (named by its seed), and the report replays the
    answer."""
    from conftest import shared_data

    from tune_as.engine import SearchRequest
    from tune_as.engine.run import run_search
    from tune_as.report.build import build_report

    experiment = f"answer-pop-{uuid.uuid4().hex[:6]}"
    common = dict(task="clinc_oos", data_dir=shared_data("clinc_oos"), losses=("softmax", "as_softmax"),
                  trials_per_loss=1, smoke=True, encoder="frozen", race=True, max_seeds=3,
                  storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri,
                  cache_dir=tmp_path / "cache", max_concurrent=2, verbose=0, asha=False)
    solo = run_search(SearchRequest(**common, experiment=experiment, name="solo"))
    populated = run_search(SearchRequest(**common, experiment=f"{experiment}-pop", name="pop",
                                         seeds_per_trial=3))
    assert populated.markdown == solo.markdown
    assert sorted((r.loss, r.seed, r.best_val) for r in populated.confirmations) == \
        sorted((r.loss, r.seed, r.best_val) for r in solo.confirmations)
    assert populated.compute.confirm_epochs == solo.compute.confirm_epochs
    assert populated.compute.confirm_trials == solo.compute.confirm_trials == 6
    client = MlflowClient(mlflow_server.uri)
    pop = client.get_experiment_by_name(f"{experiment}-pop")
    runs = client.search_runs([pop.experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_CONFIRMATION}'")
    assert sorted(r.info.run_name for r in runs) == \
        sorted(f"{r.loss}_seed{r.seed}" for r in solo.confirmations)
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert all(r.data.params["seed"] in r.info.run_name and "population_seeds" not in r.data.params
               for r in runs)
    assert all("best_val_accuracy" in r.data.metrics and "test_accuracy" in r.data.metrics for r in runs)
    # one Ray trial per loss trained its 3 seeds (the first round asks 3 of each), against one per seed
    trials = {name: [p for p in round_dir(tmp_path / "results" / name).iterdir() if p.is_dir()]
              for name in ("solo", "pop")}
    assert (len(trials["solo"]), len(trials["pop"])) == (6, 2)
    report = build_report([f"{experiment}-pop"], tmp_path / "out", mlflow_server.uri)
    (replayed,) = [t for t in report.tables if t.name.startswith("answer_")]
    logged = client.search_runs([pop.experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'")[0]
    path = client.download_artifacts(logged.info.run_id, schema.RANKING_CSV, str(tmp_path))
    assert replayed.csv() == Path(path).read_text()


def test_the_answer_fits_a_terminal_of_100_columns_and_keeps_every_cell() -> None:
    """The printed answer: at 100 columns no line is wider, no word of a cell is cut (a setting's long number
    folds onto the next line of its row), and the rows are in the CSV and JSON forms too."""
    import json

    rows = [ranking.Row("sm_softmax", {"loss.m": "0.8963863270334698", "loss.n": "6", "loss.backward": "inf"},
                        2, 2, [0.8, 0.81, 0.82], [0.79, 0.8, 0.83], True, diff="+5.07 [+2.79, +7.35]",
                        verdict="undecided (5 seeds)", best=True),
            ranking.Row("multilabel_sparse_softmax", {"loss.k": "5"}, 2, 2, [0.8, 0.81], [0.79, 0.8], True,
                        diff="-1.00 [-2.69, +0.69]", verdict="equivalent\u2020"),
            ranking.Row("bce", {}, 2, 0, [], [], False, failure="failed or diverged: nan loss at step 3")]
    table = ranking.table(rows, "digits: which loss wins", "softmax", 0.5, 0.05,
                          ["Best set on validation {x}."])
    text = table.terminal(100)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    flat = " ".join(text.split())
    for word in ("multilabel_sparse_softmax", "undecided", "equivalent\u2020", "[+2.79,", "+7.35]", "81.00",
                 "±"):
        assert word in flat, word
    assert "m=0.896," in text and "Holm, family-wise 2.5%, margin ±0.5 points" in flat
    assert [line.split()[:2] for line in lines if line.split()[:2] in (["1", "sm_softmax"], ["-", "bce"])]
    # narrower (issue 69): no number is ever cut; the columns that do not fit whole move to more blocks,
    # each headed by the rank and the loss
    for width in (60, 80):
        narrow = table.terminal(width)
        assert "\u2026" not in narrow and max(map(len, narrow.splitlines())) <= width, narrow
        flat = " ".join(narrow.split())
        for word in ("81.00", "[+2.79,", "+7.35]", "equivalent\u2020", "m=0.896,",
                     "multilabel_sparse_softmax"):
            assert word in flat, (width, word)
    assert "(continued)" in table.terminal(60) and "(continued)" not in text
    wide = table.terminal(200)
    assert "backward=inf, m=0.896, n=6" in wide, "on a wide terminal a row is one line"
    assert json.loads(table.render("json"))["rows"][0]["loss"] == "sm_softmax"
    assert "m=0.8963863270334698" in table.csv() and "m=0.8963863270334698" in table.render("json"), "exact"
    assert table.render("csv") == table.csv() and table.render("markdown") == table.markdown()


def test_settings_print_to_the_fewest_digits_that_keep_distinct_settings_distinct() -> None:
    """Issue 69: a person reads 3 significant digits, more only where two settings would look the same;
    integers and words as they are."""
    from tune_as.results.render import short_settings

    shown = short_settings([{"loss.tau": "0.6732733905579756", "lr": "0.001", "epochs": "3"},
                            {"loss.tau": "0.6731", "lr": "0.001", "loss.backward": "inf"}])
    assert shown == ["epochs=3, tau=0.6733, lr=0.001", "backward=inf, tau=0.6731, lr=0.001"]
    assert short_settings([{"m": "0.30000000000000004"}, {"m": "0.3"}]) == ["m=0.30000000000000004", "m=0.3"]
    assert short_settings([{"m": "12345.678"}]) == ["m=1.23e+04"]


def test_the_forest_plot_draws_the_answers_own_differences_intervals_and_verdicts(tmp_path: Path) -> None:
    """The headline figure: one row per loss with a difference, its point and interval in points (the table's
    numbers), coloured by its verdict word; nothing drawn for an answer without confirmation."""
    from tune_as.results.forest import BEST_MARK, VERDICT_COLOURS, forest

    plan = racing.Plan.fixed(("softmax", "a", "b"), "softmax", (5, 6, 7, 8), 4, resolution_points=100 / 359)
    r = record(losses=("softmax", "a", "b"), race=plan, mode="fixed", trials={"s": True}, failures={},
               rounds=(tuple(f"{x}{s}" for x in "sab" for s in (5, 6, 7, 8)),))
    rng = np.random.default_rng(0)
    confirmations = [run(f"s{s}", "softmax", s, 0.9, 0.90 + rng.normal(0, 0.002)) for s in (5, 6, 7, 8)]
    # a clear win
    confirmations += [run(f"a{s}", "a", s, 0.9, 0.95 + rng.normal(0, 0.002)) for s in (5, 6, 7, 8)]
    confirmations += [run(f"b{s}", "b", s, 0.9, 0.90 + rng.normal(0, 0.03)) for s in (5, 6, 7, 8)]  # noise
    answered = answer_table(r, [run("s", "softmax", 0, 0.9, 0.9)], confirmations)
    fig = forest(answered, 0.5, "softmax", "accuracy", tmp_path / "answer.png", "digits")
    assert fig is not None and (tmp_path / "answer.png").stat().st_size > 0
    ax = fig.axes[0]
    best = set(answered.decision.best)
    assert best, "equal validation: a tied best set"
    # the larger difference on top; the best set's members starred, and the legend says what the star means
    assert [t.get_text() for t in ax.get_yticklabels()] == \
        [f"{BEST_MARK} {loss}" if loss in best else loss for loss in ("b", "a")]
    assert any(t.get_text().startswith(f"{BEST_MARK} in the best set") for t in ax.get_legend().get_texts())
    points = [line for line in ax.get_lines() if line.get_marker() == "o"]
    rows = {row.loss: row for row in answered.decision.rows}
    for y, loss in enumerate(("b", "a")):
        assert points[y].get_xdata()[0] == pytest.approx(100 * rows[loss].mean_diff)
    assert points[1].get_color() == VERDICT_COLOURS["win"] and \
        points[0].get_color() == VERDICT_COLOURS["undecided"]
    labels = [t.get_text() for t in ax.child_axes[0].get_yticklabels()]  # the words at the right
    assert labels[1].startswith("win") and labels[0].startswith("undecided (4 seeds)")
    unconfirmed = answer_table(record(race=None, mode="none"), [run("s", "softmax", 0, 0.9, 0.9)], [])
    assert forest(unconfirmed, 0.5, "softmax", "accuracy", tmp_path / "none.png") is None


def test_a_record_that_contradicts_its_search_is_refused_naming_the_field() -> None:
    """answer.json is data to check (issue 70): a record whose alpha is not the search's 0.05, or whose
    margin, baseline, losses, noise model or seeds differ from the parent run's params, is not replayed."""
    r = record()
    params = {"baseline": "softmax", "losses": "softmax,a,b,c", "margin_points": "0.5", "noise": "moderated",
              "max_seeds": "5", "race": "True", "confirm": "0"}
    assert r.disagreement(params) is None
    assert r.disagreement({}) is None, \
        "a search that logged none of them (older tune_as) has nothing to contradict"
    for key, value, field in [("margin_points", "1.0", "margin_points"), ("baseline", "a", "baseline"),
                              ("losses", "softmax,a", "losses"), ("noise", "per-loss", "race.noise"),
                              ("max_seeds", "3", "race.max_seeds")]:
        problem = r.disagreement({**params, key: value})
        assert problem is not None and problem.startswith(f"{field}: expected the search's") or \
            problem is not None and problem.startswith(f"{field}: expected at most"), (key, problem)
    with pytest.raises(ValueError, match=r"race.alpha: expected 0.05 \(the search's family-wise level\), "
                                         r"received 0.99"):
        AnswerRecord.from_json(r.to_json().replace('"alpha": 0.05', '"alpha": 0.99'))
