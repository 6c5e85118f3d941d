"""End-to-end: the real CLI path with real Ray, real Optuna and a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import shared_data
from mlflow.tracking import MlflowClient

from tune_as.engine import SearchRequest
from tune_as.engine.run import run_search
from tune_as.results.verdicts import unmarked
from tune_as.search import main

pytestmark = pytest.mark.slow


def _runs(uri: str, experiment: str) -> tuple[list, list]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment} was not created"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("tune_as.role") == "search"]
    children = [r for r in runs if r.data.tags.get("tune_as.role") == "trial"]
    return parents, children


def test_smoke_search_on_clinc_tracks_every_trial(tmp_path: Path, mlflow_server, ray_local) -> None:
    data_dir = shared_data("clinc_oos")
    outcome = run_search(SearchRequest(
        task="clinc_oos", losses=("softmax", "as_softmax"), trials_per_loss=3, smoke=True, data_dir=data_dir,
        storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri, experiment="e2e-clinc",
        cache_dir=tmp_path / "cache", max_concurrent=2, verbose=0, asha=False))
    rows = {row.loss: row for row in outcome.rows}
    assert set(rows) == {"softmax", "as_softmax"}
    assert 0.0 <= rows["as_softmax"].val[0] <= 1.0 and "loss.delta" in rows["as_softmax"].setting
    assert all(row.completed == 3 and not row.confirmed for row in rows.values())

    parents, children = _runs(mlflow_server.uri, "e2e-clinc")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["losses"] == "softmax,as_softmax"
    assert parent.data.tags["tune_as.metric"] == "val_accuracy"
    assert len(children) == 6
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert sorted(c.data.tags["tune_as.loss"] for c in children) == ["as_softmax"] * 3 + ["softmax"] * 3
    client = MlflowClient(mlflow_server.uri)
    for child in children:
        assert child.info.status == "FINISHED"
        params, metrics = child.data.params, child.data.metrics
        assert params["task"] == "clinc_oos" and params["backbone"] == "tiny" and \
            len(params["git_commit"]) >= 7
        for key in ("val_accuracy", "val_loss", "train_loss", "masked_ratio", "optimizer_steps",
                    "samples_seen", "train_seconds", "test_accuracy", "best_val_accuracy", "accum_steps",
                    "epoch"):
            assert key in metrics, f"{key} missing from {sorted(metrics)}"
        history = client.get_metric_history(child.info.run_id, "val_accuracy")
        assert [m.step for m in history] == [1, 2], "one point per epoch, logged once each"
        assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["pmargin.npy"]
        assert child.info.run_name.startswith(params["loss"] + "_"), "run names carry the loss"
        if params["loss"] == "as_softmax":
            assert 0.05 <= float(params["loss.delta"]) <= 0.5 and "warmup_r" in params
            assert child.data.tags["tune_as.setting"] == (f"delta={float(params['loss.delta']):.4g}, "
                                                          f"warmup_r={float(params['warmup_r']):.4g}")
        else:  # a loss without AS warm-up or row skipping logs neither (settings.unused)
            assert not {"loss.delta", "warmup_r", "skip_masked_rows"} & set(params)
            assert child.data.tags["tune_as.setting"] == "none searched"
        # the answer's unit beside the fraction the report reads; the run page opens on its scores
        assert metrics["test_accuracy_pct"] == round(100 * metrics["test_accuracy"], 2)
        assert metrics["best_val_accuracy_pct"] == round(100 * metrics["best_val_accuracy"], 2)
        assert child.data.tags["mlflow.note.content"].startswith(
            f"**{params['loss']}**: validation accuracy {100 * metrics['best_val_accuracy']:.2f} %")
        # the run names its Optuna trial, which names the run and its Ray trial back
        study = optuna.load_study(study_name=child.data.tags["tune_as.optuna_study"],
                                  storage=parent.data.tags["tune_as.optuna_storage"])
        assert study.study_name == f"clinc_oos-{params['loss']}"
        assert study.trials[int(child.data.tags["tune_as.optuna_trial"])].user_attrs == {
            "ray_trial_id": child.data.tags["tune_as.trial_id"], "mlflow_run_name": child.info.run_name}
    # the paper's Table 6 setting was evaluated first, as a warm start
    first_as = min((c for c in children if c.data.params["loss"] == "as_softmax"),
                   key=lambda c: c.info.start_time)
    assert float(first_as.data.params["loss.delta"]) == 0.3 and \
        float(first_as.data.params["warmup_r"]) == 0.15
    # seeds vary for a loss with nothing to tune (so both losses are best-of-3)
    assert sorted(c.data.params["seed"] for c in children if c.data.params["loss"] == "softmax") == \
        ["0", "1", "2"]
    # the Optuna study is in a database optuna-dashboard can open
    (search_dir,) = (tmp_path / "results").iterdir()
    study = optuna.load_study(study_name="clinc_oos-as_softmax",
                              storage=f"sqlite:///{search_dir / 'optuna.db'}")
    assert len(study.trials) == 3 and all(t.state.name == "COMPLETE" for t in study.trials)
    assert study.metric_names == ["best_val_accuracy"]  # the objective is named in optuna-dashboard
    # the runs table's saved view of this search, the address the search prints (tune_as.tracking.views)
    views = client.get_experiment(parent.info.experiment_id).tags
    assert f"mlflow.sharedViewState.{parent.data.tags['tune_as.search_id']}" in views


ASHA_SPACE = """task: digits
trials_per_loss: 6
fixed: {epochs: 4, batch_size: 64}
losses:
  softmax:
    params:
      lr: {type: categorical, choices: [3.0e-3, 1.0e-7]}
    paper: {lr: 3.0e-3}
"""


def test_asha_stops_bad_trials_early(tmp_path: Path, mlflow_server, ray_local) -> None:
    """Sequential trials, half of which cannot learn (lr=1e-7): ASHA must cut some at the first rung. The
    space has 2 settings, so the search runs each once (a repeat would be the same run), then ends."""
    space = tmp_path / "digits.yaml"
    space.write_text(ASHA_SPACE)
    run_search(SearchRequest(
        task="digits", search_space=space, storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri,
        experiment="e2e-asha", cache_dir=tmp_path / "cache", max_concurrent=1, grace_period=1.0,
        reduction_factor=2.0, verbose=0, seed=3))
    _, children = _runs(mlflow_server.uri, "e2e-asha")
    assert sorted(float(c.data.params["lr"]) for c in children) == [1e-7, 3e-3], \
        "each setting once, not 6 trials"
    stopped = [c for c in children if c.data.tags.get("tune_as.stopped_early") == "true"]
    full = [c for c in children if "tune_as.stopped_early" not in c.data.tags]
    assert stopped, "ASHA stopped no trial"
    assert all(c.data.metrics["epoch"] < 4 for c in stopped)
    assert all(c.data.metrics["epoch"] == pytest.approx(4) for c in full)
    # an image task's CNN has no tokenizer and no encoder to freeze: those settings are not logged
    assert not {"max_length", "encoder", "encode_precision"} & {k for c in children for k in c.data.params}
    assert max(c.data.metrics["best_val_accuracy"] for c in full) > 0.8
    # optuna-dashboard shows the cut trials as pruned, valued by the evaluation they were cut at
    (search_dir,) = (tmp_path / "results").iterdir()
    study = optuna.load_study(study_name="digits-softmax", storage=f"sqlite:///{search_dir / 'optuna.db'}")
    states = {float(t.params["lr"]): t.state.name for t in study.trials if "repeat_of" not in t.user_attrs}
    assert states == {float(c.data.params["lr"]): "PRUNED" if c.data.tags.get("tune_as.stopped_early") else
                      "COMPLETE" for c in children}
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert all(t.value == t.intermediate_values[t.last_step or 0] for t in pruned)


@pytest.mark.parametrize(("argv", "message"), [
    (["--task", "nosuchtask"], "nosuchtask"),
    (["--task", "digits", "--losses", "bce"], "bce"),
    (["--task", "digits", "--trials-per-loss", "0"], "--trials-per-loss: expected a number > 0, got 0"),
    (["--task", "sst5", "--data-dir", "/nonexistent/dir"], "--data-dir: expected an existing folder"),
    (["--task", "digits", "--mlflow-uri", "http://127.0.0.1:9"], "is not usable: expected a reachable"),
])
def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    storage = tmp_path / "results"
    code = main([*argv, "--storage-path", str(storage), "--smoke"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not storage.exists(), "a result folder was created for a search that never started"


PER_LOSS_SPACE = """task: digits
trials_per_loss: 4
fixed: {epochs: 3, batch_size: 64}
losses:
  softmax:
    fixed: {lr: 3.0e-3}
  label_smoothing:
    params:
      lr: {type: categorical, choices: [3.0e-4, 1.0e-7]}
    fixed: {eps: 0.0}
    paper: {lr: 3.0e-4}
"""


def test_early_stopping_is_per_loss_and_confirm_ranks_on_new_seeds(tmp_path: Path, mlflow_server,
                                                                   ray_local) -> None:
    """label_smoothing at lr 3e-4 learns slower in its first epoch than softmax at 3e-3: one ASHA for both
    would stop it; per loss it is compared only with its own trials, and its hopeless lr (1e-7) is still
    stopped. Then --confirm 2 re-runs each loss's selected setting with 2 new seeds and ranks on them."""
    space = tmp_path / "digits.yaml"
    space.write_text(PER_LOSS_SPACE)
    outcome = run_search(SearchRequest(
        task="digits", search_space=space, storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri,
        experiment="e2e-per-loss", cache_dir=tmp_path / "cache", max_concurrent=1, grace_period=1.0,
        reduction_factor=2.0, verbose=0, seed=3, confirm=2))
    _, children = _runs(mlflow_server.uri, "e2e-per-loss")
    slow = [c for c in children if c.data.params["loss"] == "label_smoothing"]
    stopped = {float(c.data.params["lr"]): c.data.tags.get("tune_as.stopped_early") == "true" for c in slow}
    assert len(slow) == 2 and set(stopped) == {3e-4, 1e-7}, stopped  # 2 settings: each once, not 4 trials
    for c in slow:
        was_stopped = c.data.tags.get("tune_as.stopped_early") == "true"
        assert was_stopped == (float(c.data.params["lr"]) == 1e-7), \
            (c.data.params["lr"], c.data.metrics["epoch"])
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("e2e-per-loss")
    confirmations = client.search_runs([exp.experiment_id], "tags.`tune_as.role` = 'confirmation'")
    assert sorted(c.data.tags["tune_as.loss"] for c in confirmations) == \
        ["label_smoothing"] * 2 + ["softmax"] * 2
    assert {c.data.params["lr"] for c in confirmations
            if c.data.tags["tune_as.loss"] == "label_smoothing"} == {"0.0003"}
    trial_seeds = {c.data.params["seed"] for c in children}
    assert not trial_seeds & {c.data.params["seed"] for c in confirmations}, "confirmation seeds must be new"
    rows = {row.loss: row for row in outcome.rows}
    assert rows["label_smoothing"].confirmed and len(rows["label_smoothing"].test) == 2
    verdict = unmarked(rows["label_smoothing"].verdict)  # the step-down mark is an annotation
    assert rows["label_smoothing"].diff and (verdict in ("win", "loss", "equivalent")
                                             or verdict == "undecided (2 seeds)")
    parents, _ = _runs(mlflow_server.uri, "e2e-per-loss")
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"ranking.md", "ranking.csv"} <= artifacts
    # what it cost: every trial's epochs (stopped ones at their rung), the confirmations' in full, on the
    # parent too
    c = outcome.compute
    # softmax has nothing to tune: one search trial (confirmation brings its seeds); label_smoothing one per
    # setting
    assert (c.search_trials, c.confirm_trials) == (3, 4) and c.confirm_epochs == 4 * 3
    assert c.search_epochs == sum(float(ch.data.metrics["epoch"]) for ch in children) < 3 * 3
    assert "label_smoothing: 2 search trials, every setting of its space once" in outcome.markdown
    assert parents[0].data.metrics["compute_search_epochs"] == c.search_epochs


OWN_EPOCHS_SPACE = """task: digits
trials_per_loss: 2
fixed: {epochs: 2, batch_size: 64, lr: 3.0e-3}
losses:
  softmax: {}
  label_smoothing:
    fixed: {epochs: 1, eps: 0.1}
"""


def test_a_loss_with_its_own_epochs_is_judged_complete_at_its_own_epochs(tmp_path: Path, mlflow_server,
                                                                          ray_local) -> None:
    """A loss that trains 1 epoch where the others train 2 completed its trials: it is not "stopped early",
    it has a result, and its runs say so in MLflow (the bug: every trial was judged against the base
    epochs)."""
    space = tmp_path / "digits.yaml"
    space.write_text(OWN_EPOCHS_SPACE)
    outcome = run_search(SearchRequest(
        task="digits", search_space=space, storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri,
        experiment="e2e-own-epochs", cache_dir=tmp_path / "cache", max_concurrent=1, verbose=0,
        max_train_samples=300, max_eval_samples=100))
    rows = {row.loss: row for row in outcome.rows}
    assert rows["label_smoothing"].completed == 2 and rows["label_smoothing"].val, rows["label_smoothing"]
    _, children = _runs(mlflow_server.uri, "e2e-own-epochs")
    short = [c for c in children if c.data.params["loss"] == "label_smoothing"]
    assert [c.data.params["epochs"] for c in short] == ["1.0", "1.0"]
    assert all(c.data.tags.get("tune_as.stopped_early") != "true" for c in short)
    assert {c.data.params["max_train_samples"] for c in children} == {"300"}, \
        "data settings logged with every trial"
    assert not any("max_length" in c.data.params for c in children), "an image task has no sequence length"
    assert "epochs per loss: softmax 2, label_smoothing 1" in outcome.markdown


RACE_SPACE = """task: digits
trials_per_loss: 2
fixed: {epochs: 1, batch_size: 64, lr: 3.0e-3}
losses:
  softmax: {}
  label_smoothing:
    fixed: {eps: 0.1}
"""


def test_a_race_within_a_budget_runs_whole_rounds_and_says_what_it_spent(tmp_path: Path, mlflow_server,
                                                                          ray_local) -> None:
    """--race with --budget: losses with nothing to tune get one search trial each (2 epochs); round 1 (3
    seeds x 2 losses = 6 epochs) fits a budget of 8, round 2 (2 more seeds each: 4 epochs) does not, so the
    race stops after round 1 (its last look, fixed by the budget before the first seed) and the answer says
    so; every verdict is one of the four words."""
    space = tmp_path / "digits.yaml"
    space.write_text(RACE_SPACE)
    outcome = run_search(SearchRequest(
        task="digits", search_space=space, storage_path=tmp_path / "results", mlflow_uri=mlflow_server.uri,
        experiment="e2e-race", cache_dir=tmp_path / "cache", max_concurrent=2, verbose=0, race=True,
        max_seeds=5, budget=8.0, max_train_samples=300, max_eval_samples=100))
    c = outcome.compute
    assert (c.search_trials, c.search_epochs) == (2, 2.0), "one search trial per loss with nothing to tune"
    assert c.confirm_trials == 6 and c.search_epochs + c.confirm_epochs <= 8.0
    rows = {row.loss: row for row in outcome.rows}
    assert rows["softmax"].verdict == "baseline" and len(rows["softmax"].test) == 3
    verdict = unmarked(rows["label_smoothing"].verdict)  # the step-down mark is an annotation
    assert verdict in ("win", "loss", "equivalent", "undecided (3 seeds)"), verdict
    # the budget left after the search (6) pays 3 seeds for both losses: the race's last look is there
    assert "--budget 8: the race's last look is at 3 seeds per loss" in outcome.markdown
    assert "of a budget of 8" in c.line()



@pytest.mark.slow
def test_format_json_puts_the_answer_alone_on_stdout(tmp_path: Path, mlflow_server, ray_local,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--format json | jq`: the answer is the whole of stdout, valid JSON; the banner, progress, notes, the
    compute line and MLflow's address go to stderr (issue 69: ~41 lines shared stdout with it)."""
    import json

    from tune_as.search import main

    code = main(["--task", "digits", "--losses", "softmax,sparsemax", "--trials-per-loss", "1",
                 "--max-epochs", "1", "--confirm", "2", "--max-train-samples", "300", "--format", "json",
                 "--mlflow-uri", mlflow_server.uri, "--storage-path", str(tmp_path / "results"),
                 "--experiment", "e2e-json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    answer = json.loads(out)
    assert answer["title"].startswith("digits: which loss wins")
    assert {row["loss"] for row in answer["losses"]} == {"softmax", "sparsemax"}
    # numbers as numbers: the structured answer (results.answer.structured), not the table's display strings
    sparsemax = next(row for row in answer["losses"] if row["loss"] == "sparsemax")
    assert isinstance(sparsemax["diff_points"], float) and len(sparsemax["interval_points"]) == 2
    assert len(sparsemax["test_points"]["values"]) == sparsemax["seeds"] == 2
    assert "Compute: " in err and "MLflow: " in err and "digits: a search of losses softmax, sparsemax" in err
