"""Fast tests of the search engine's parts, without a Ray cluster: the per-loss scheduler (its rungs checked
against Ray's own ASHA, real Tune `Trial` objects), the per-loss Optuna searcher (in-memory SQLite), the
ranking rules and request validation."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from tune_as.engine.request import SearchRequest
from tune_as.engine.schedulers import PerLossASHA, default_grace_period
from tune_as.engine.searcher import PerLossSearcher
from tune_as.errors import UserError
from tune_as.results import racing, ranking
from tune_as.results.selection import TrialRun
from tune_as.settings import TrialSettings
from tune_as.space.search_space import load_search_space

METRIC = "val_accuracy"


def trial(loss: str, **config: Any) -> Trial:
    return Trial("trainable", config={"loss": loss, **config}, stub=True)


def scheduler(tmp: Path | None = None, trials_per_loss: int = 6, rf: float = 2.0) -> PerLossASHA:
    s = PerLossASHA("epoch", 4.0, 1.0, rf, trials_per_loss, tmp / "scheduler.json" if tmp else None)
    s.set_search_properties(METRIC, "max")
    return s


def result(s: PerLossASHA, t: Trial, epoch: float, acc: float) -> str:
    return s.on_trial_result(None, t, {"epoch": epoch, METRIC: acc})


def test_a_slow_loss_is_judged_only_against_its_own_trials() -> None:
    """Softmax trials reach 0.9 after one epoch, the slow loss's 0.3: one ASHA for both would stop the slow
    loss at its first rung; per loss, its good trial continues and its bad setting is stopped."""
    s = scheduler()
    fast = [trial("softmax") for _ in range(3)]
    slow_good, slow_bad = trial("slow"), trial("slow")
    for t in [*fast, slow_good, slow_bad]:
        s.on_trial_add(None, t)
    for t in fast:
        assert result(s, t, 1.0, 0.9) == TrialScheduler.CONTINUE
    assert result(s, slow_good, 1.0, 0.3) == TrialScheduler.CONTINUE
    assert result(s, slow_bad, 1.0, 0.05) == TrialScheduler.STOP  # a bad setting of the same loss
    assert set(s.by_loss) == {"softmax", "slow"}


def test_one_set_of_rungs_for_every_loss_cuts_the_slow_loss() -> None:
    """The ablation (--asha-scope search): the slow loss's good setting is judged against softmax and cut."""
    s = PerLossASHA("epoch", 4.0, 1.0, 2.0, 6, scope="search")
    s.set_search_properties(METRIC, "max")
    fast, slow_good = [trial("softmax") for _ in range(3)], trial("slow")
    for t in [*fast, slow_good]:
        s.on_trial_add(None, t)
    for t in fast:
        result(s, t, 1.0, 0.9)
    assert result(s, slow_good, 1.0, 0.3) == TrialScheduler.STOP


def test_a_loss_with_fewer_trials_than_the_reduction_factor_is_never_stopped() -> None:
    s = scheduler(trials_per_loss=2, rf=3.0)
    a, b = trial("softmax"), trial("softmax")
    for t in (a, b):
        s.on_trial_add(None, t)
    assert result(s, a, 1.0, 0.9) == TrialScheduler.CONTINUE
    assert result(s, b, 1.0, 0.1) == TrialScheduler.CONTINUE  # ASHA would stop it (cutoff = a's 0.9)
    assert not s.stops_early


def test_brackets_survive_a_restart_of_the_driver(tmp_path: Path) -> None:
    first = scheduler(tmp_path)
    good, bad = trial("slow"), trial("slow")
    for t in (good, bad):
        first.on_trial_add(None, t)
    assert result(first, good, 1.0, 0.8) == TrialScheduler.CONTINUE
    # a new driver process: Tune restores the scheduler as it was created (empty), ours reads its file
    again = scheduler(tmp_path)
    again.on_trial_add(None, bad)
    assert result(again, bad, 1.0, 0.1) == TrialScheduler.STOP, \
        "the rung value of before the restart was lost"
    fresh = scheduler()
    fresh.on_trial_add(None, bad)
    assert result(fresh, bad, 1.0, 0.1) == TrialScheduler.CONTINUE  # what a lost state would have decided


@pytest.mark.parametrize("seed", range(6))
def test_the_rungs_decide_as_rays_own_asha_decides(seed: int) -> None:
    """Our rungs (kept by us so that a resume reads them back) against Ray's `ASHAScheduler` with one bracket,
    the oracle: the same stream of results (trials interleaved, fractional epochs, ties, completions, a mode
    "min" search) gets the same decision every time."""
    from ray.tune.schedulers import ASHAScheduler

    rng = random.Random(seed)
    rf, grace, max_t = rng.choice([2.0, 3.0, 4.0]), rng.choice([0.5, 1.0, 4 / 3]), rng.choice([4.0, 10.0])
    mode = rng.choice(["max", "min"])
    ours = PerLossASHA("epoch", max_t, grace, rf, trials_per_loss=99)
    ours.set_search_properties(METRIC, mode)
    ray_asha = ASHAScheduler(time_attr="epoch", metric=METRIC, mode=mode, max_t=max_t,  # type: ignore[arg-type]
                             grace_period=grace, reduction_factor=rf)  # type: ignore[arg-type]
    trials = [trial("softmax") for _ in range(12)]
    epoch = dict.fromkeys(trials, 0.0)
    live = list(trials)
    cut = 0
    for t in trials:
        ours.on_trial_add(None, t)
        ray_asha.on_trial_add(None, t)
    while live:
        t = rng.choice(live)
        epoch[t] += rng.choice([0.25, 0.5, 1.0])
        metrics = {"epoch": epoch[t], METRIC: rng.choice([0.1, 0.5, 0.5, 0.9, rng.random()])}
        if rng.random() < 0.05:  # the trial ends on its own (Tune calls on_trial_complete)
            ours.on_trial_complete(None, t, metrics)
            ray_asha.on_trial_complete(None, t, metrics)
            live.remove(t)
            continue
        decision = ours.on_trial_result(None, t, metrics)
        assert decision == ray_asha.on_trial_result(None, t, metrics), (t, metrics)
        if decision == TrialScheduler.STOP:
            cut += epoch[t] < max_t
            live.remove(t)
    assert cut  # the stream makes ASHA cut trials before max_t (the test would be vacuous without)


@pytest.mark.parametrize(("epochs", "rf", "grace"), [(10, 3, 10 / 3), (2, 3, 1.0), (1, 3, 1.0),
                                                     (30, 3, 10.0)])
def test_default_grace_period_is_a_fair_part_of_the_epochs(epochs: float, rf: float, grace: float) -> None:
    assert default_grace_period(epochs, rf) == pytest.approx(grace)


SPACE = """task: digits
trials_per_loss: 3
fixed: {epochs: 2}
losses:
  softmax: {params: {}}
  as_softmax:
    params:
      delta: {type: float, low: 0.1, high: 0.5}
    paper: {delta: 0.3}
"""


def test_searcher_gives_each_loss_its_quota_warm_start_first_and_seeds_for_parameterless(
        tmp_path: Path) -> None:
    path = tmp_path / "digits.yaml"
    path.write_text(SPACE)
    space = load_search_space(path, "multiclass")
    base = TrialSettings(loss="softmax", epochs=2, batch_size=32, lr=1e-3, seed=5)
    searcher = PerLossSearcher(space, base, f"sqlite:///{tmp_path / 'optuna.db'}", "digits",
                               "best_val_accuracy", 0)
    configs = [searcher.suggest(f"t{i}") for i in range(7)]
    assert configs[-1] == "FINISHED"
    by_loss: dict[str, list[dict[str, Any]]] = {}
    for c in configs[:-1]:
        assert isinstance(c, dict)
        TrialSettings.from_dict(c)  # every suggestion is a valid trial config
        by_loss.setdefault(c["loss"], []).append(c)
    assert {k: len(v) for k, v in by_loss.items()} == {"softmax": 3, "as_softmax": 3}
    assert by_loss["as_softmax"][0]["loss.delta"] == 0.3  # the paper's Table 6 setting goes first
    assert [c["seed"] for c in by_loss["softmax"]] == [5, 6, 7]
    for i in range(len(configs) - 1):
        searcher.on_trial_complete(f"t{i}", {"best_val_accuracy": 0.5 + i / 100})
    study = searcher.study("as_softmax")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    searcher.on_trial_complete("t0", {"error": "diverged"})  # told twice (a restart): ignored


def test_an_optuna_trial_its_ray_trial_and_its_mlflow_run_name_each_other(tmp_path: Path) -> None:
    """The searcher marks each Optuna trial with its Ray trial's id; when the trial's MLflow run opens, its
    tags name the study and trial number, and the Optuna trial the run's name (optuna-dashboard shows both).
    The links go through the database, so a pickled copy (Ray's, after a resume) finds them too."""
    import pickle

    import optuna

    from tune_as.engine.links import OptunaLinks

    searcher = _searcher(tmp_path, SPACE)
    configs = {f"ray{i}": searcher.suggest(f"ray{i}") for i in range(4)}
    links = pickle.loads(pickle.dumps(OptunaLinks(f"sqlite:///{tmp_path / 'optuna.db'}", "digits")))
    for ray_id, config in configs.items():
        assert isinstance(config, dict)
        loss = config["loss"]
        tags = links.tags(ray_id, loss, f"{loss}_000{ray_id[-1]}")
        study = optuna.load_study(study_name=tags["tune_as.optuna_study"],
                                  storage=f"sqlite:///{tmp_path / 'optuna.db'}")
        assert tags["tune_as.optuna_study"] == f"digits-{loss}"
        marked = study.trials[int(tags["tune_as.optuna_trial"])]
        assert marked.user_attrs == {"ray_trial_id": ray_id, "mlflow_run_name": f"{loss}_000{ray_id[-1]}"}
        if loss == "as_softmax":
            assert marked.params["delta"] == config["loss.delta"]
    assert links.tags("unknown", "softmax", "softmax_0009") == {}  # a search from before the links
    assert links.tags("ray0", "no_such_loss", "x") == {}


def test_a_finished_runs_description_says_its_scores_in_percent_its_epochs_and_setting() -> None:
    """The MLflow run page opens on the run's description: the answer's numbers for this one run."""
    from tune_as.engine.callbacks import run_note

    config = {"loss": "as_softmax", "epochs": 5.0, "loss.delta": 0.3}
    assert run_note(config, {"best_val_accuracy": 0.93206, "test_accuracy": 0.9, "epoch": 2.0}, "accuracy",
                    "delta=0.3") == ("**as_softmax**: validation accuracy 93.21 %, test accuracy 90.00 % "
                                     "(2 of 5 epochs); setting: delta=0.3")
    assert run_note(config, {"epoch": 0.0}, "f1", "delta=0.3").startswith("**as_softmax**: no score (0 of 5")


def test_optuna_trials_mirror_ray_trials_and_those_cut_early_are_pruned(tmp_path: Path) -> None:
    """What optuna-dashboard reads: a trial early stopping cut before its epochs is PRUNED, valued by the last
    evaluation it reached (TPE ranks pruned trials by how far they got); one that trained all its epochs
    COMPLETE; an error FAIL. Every evaluation is an intermediate value at the samples seen. Results are
    flattened as Tune flattens them for a searcher."""
    import pickle

    import optuna
    from ray.tune.utils import flatten_dict

    searcher = _searcher(tmp_path, SPACE)
    configs = {f"t{i}": searcher.suggest(f"t{i}") for i in range(6)}
    ids = {loss: [t for t, c in configs.items() if isinstance(c, dict) and c["loss"] == loss]
           for loss in ("softmax", "as_softmax")}

    def result(t: str, best: float, samples: int, epoch: float, **extra: Any) -> dict[str, Any]:
        return flatten_dict({"best_val_accuracy": best, "samples_seen": samples, "epoch": epoch,
                             "config": configs[t], **extra})

    full, cut, crashed = ids["as_softmax"]
    searcher.on_trial_result(full, result(full, 0.6, 100, 1.0))
    searcher.on_trial_result(cut, result(cut, 0.3, 50, 0.5))
    searcher.on_trial_result(crashed, result(crashed, 0.5, 100, 1.0))
    searcher = pickle.loads(pickle.dumps(searcher))  # Tune pickles its searcher; the storage does not travel
    searcher.on_trial_complete(full, result(full, 0.8, 200, 2.0))
    # Tune stopped it on this result: 1 of 2 epochs
    searcher.on_trial_complete(cut, result(cut, 0.4, 100, 1.0))
    searcher.on_trial_complete(crashed, error=True)
    diverged, finished, stopped = ids["softmax"]
    searcher.on_trial_complete(diverged, result(diverged, 0.2, 100, 1.0, error="non-finite training loss"))
    searcher.on_trial_complete(finished, result(finished, 0.7, 200, 2.0))
    searcher.on_trial_complete(stopped)  # stopped while pending (the search was stopped): no result

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.load_study(study_name="digits-as_softmax", storage=url)
    assert study.trials_dataframe()["state"].tolist() == ["COMPLETE", "PRUNED", "FAIL"]
    assert [t.value for t in study.trials[:2]] == [0.8, 0.4]
    assert [t.intermediate_values for t in study.trials] == \
        [{100: 0.6, 200: 0.8}, {50: 0.3, 100: 0.4}, {100: 0.5}]
    assert study.metric_names == ["best_val_accuracy"]  # the objective is named in optuna-dashboard
    softmax = optuna.load_study(study_name="digits-softmax", storage=url)
    assert [t.state.name for t in softmax.trials] == ["FAIL", "COMPLETE", "FAIL"]


def run(i: int, loss: str, val: float, test: float, seed: int, stopped: bool = False,
        **params: str) -> TrialRun:
    return TrialRun(f"r{i}", "digits", loss, {"loss": loss, "seed": str(seed), **params}, "accuracy", val,
                    {"test_accuracy": test, "optimizer_steps": 10.0}, start_time=i, stopped_early=stopped)


def _answer(confirmations: list[TrialRun], losses: list[str], seeds: list[int],
            baseline: str = "softmax") -> tuple[racing.Answer, racing.Plan]:
    plan = racing.Plan.fixed(losses, baseline, seeds, len(seeds))
    return racing.decide(ranking.race_results(confirmations, "accuracy"), plan), plan


def test_ranking_uses_completed_trials_and_confirmed_seeds_with_verdicts() -> None:
    trials = [run(0, "softmax", 0.90, 0.89, 0), run(1, "as_softmax", 0.95, 0.50, 1, **{"loss.delta": "0.3"}),
              run(2, "as_softmax", 0.97, 0.99, 2, stopped=True, **{"loss.delta": "0.1"}),
              run(3, "sparsemax", 0.99, 0.99, 3, stopped=True)]
    assert ranking.confirmation_seeds(trials, 3) == [4, 5, 6]
    confirmations = [run(10 + s, "softmax", 0.9, 0.90 + s / 1000, s) for s in (4, 5, 6)] + \
                    [run(20 + s, "as_softmax", 0.93 + s / 1000, 0.92 + s / 500, s, **{"loss.delta": "0.3"})
                     for s in (4, 5, 6)]
    answer, plan = _answer(confirmations, ["softmax", "as_softmax"], [4, 5, 6])
    losses = ["softmax", "as_softmax", "sparsemax", "bce"]
    rows = {r.loss: r for r in ranking.rank(trials, confirmations, "accuracy", losses, answer, plan)}
    assert rows["as_softmax"].setting == {"loss.delta": "0.3"}, "the stopped trial must not be selected"
    assert rows["as_softmax"].confirmed and rows["as_softmax"].verdict == "win"
    assert rows["as_softmax"].diff.startswith("+2.") and rows["as_softmax"].best
    assert rows["softmax"].verdict == "baseline" and not rows["softmax"].best
    assert not rows["sparsemax"].val and rows["sparsemax"].failure == "every trial was stopped early"
    assert rows["bce"].failure == "no trial ran", "every loss of the request has a row"
    text = ranking.table(list(rows.values()), "t", "softmax", 0.5, 0.05).markdown()
    assert "no result: every trial was stopped early" in text and "±" in text
    assert "verdict (Holm, family-wise 2.5%, margin ±0.5 pts)" in text
    # the ranking follows validation, never test
    assert [r.loss for r in ranking.rank(trials, [], "accuracy")][:2] == ["as_softmax", "softmax"]


def test_a_seed_confirmed_twice_counts_once_in_its_row_as_in_the_race() -> None:
    """Two runs of one (loss, seed) (a resume can run a setting again: docs/architecture.md): the row's values
    are one per seed, the run the race decided on (race_results keeps the last), never both."""
    trials = [run(0, "softmax", 0.9, 0.9, 0), run(1, "sparsemax", 0.9, 0.9, 1)]
    confirmations = [run(10 + s, "softmax", 0.9, 0.90, s) for s in (2, 3, 4)] + \
                    [run(20 + s, "sparsemax", 0.9 + s / 100, 0.91, s) for s in (2, 3, 4)] + \
                    [run(30, "sparsemax", 0.5, 0.91, 3)]  # seed 3 again, after the first
    assert ranking.race_results(confirmations, "accuracy")["sparsemax"][3] == (0.5, 0.91)
    answer, plan = _answer(confirmations, ["softmax", "sparsemax"], [2, 3, 4])
    rows = {r.loss: r for r in ranking.rank(trials, confirmations, "accuracy", [], answer, plan)}
    assert rows["sparsemax"].val == pytest.approx([0.92, 0.5, 0.94]) and len(rows["sparsemax"].test) == 3


def test_ranking_with_three_noisy_seeds_says_undecided_with_its_seeds() -> None:
    trials = [run(0, "softmax", 0.9, 0.9, 0), run(1, "sparsemax", 0.9, 0.9, 1)]
    confirmations = [run(10 + s, "softmax", 0.9, 0.90, s) for s in (2, 3, 4)] + \
                    [run(20 + s, "sparsemax", 0.9, t, s)
                     for s, t in zip((2, 3, 4), (0.91, 0.89, 0.93), strict=True)]
    answer, plan = _answer(confirmations, ["softmax", "sparsemax"], [2, 3, 4])
    rows = {r.loss: r for r in ranking.rank(trials, confirmations, "accuracy", [], answer, plan)}
    assert rows["sparsemax"].verdict == "undecided (3 seeds)"


@pytest.mark.parametrize(("fields", "message"), [
    ({"confirm": -1}, "--confirm: expected a non-negative integer"),
    ({"seed": 2**32}, "--seed: expected an integer in [0, 4294967295]"),
    ({"seed": -1}, "--seed: expected an integer in [0"),
    ({"losses": ()}, "--losses: expected comma-separated loss names, got none"),
    ({"name": "../escape"}, "--name: expected one path segment"),
    ({"name": "a/b"}, "--name: expected one path segment"),
    ({"name": "it's"}, "--name: expected one path segment"),
    ({"max_seeds": 2}, "--max-seeds: expected an integer in [3, 100]"),
    ({"margin": float("nan")}, "--margin: expected points in [0, 100]"),
    ({"race": True, "confirm": 3}, "--race: expected either --race"),
    ({"confirm": 1}, "--confirm: expected 0 or at least 2 seeds"),
    ({"budget": float("inf")}, "--budget: expected a number > 0"),
    ({"confirm": 3, "confirm_top": 0}, "--confirm-top: expected a positive integer"),
    ({"confirm": 3, "confirm_top": True}, "--confirm-top: expected a positive integer"),
    ({"confirm_top": 2}, "--confirm-top: expected --confirm N too"),
    ({"sampler": "grid"}, "--sampler: expected one of tpe, random, got 'grid'"),
    ({"asha_scope": "global"}, "--asha-scope: expected 'loss' or 'search'"),
])
def test_request_validation(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        SearchRequest(task="digits", **fields).check()


def test_row_skipping_for_a_loss_that_cannot_skip_exits_2_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tune_as.search import main

    code = main(["--task", "digits", "--losses", "softmax,as_softmax", "--set", "skip_masked_rows=true",
                 "--storage-path", str(tmp_path / "r"), "--mlflow-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("error: skip_masked_rows: expected false for softmax")
    assert not (tmp_path / "r").exists() and not (tmp_path / "m.db").exists()


def test_ranking_compares_validation_where_the_task_has_no_test_labels() -> None:
    """GLUE tasks hide test labels: the verdicts fall back to the confirmed validation metric, marked
    (val)."""
    def val_run(i: int, loss: str, val: float, seed: int) -> TrialRun:
        return TrialRun(f"v{i}", "rte", loss, {"loss": loss, "seed": str(seed)}, "accuracy", val,
                        {"optimizer_steps": 1.0}, start_time=i)

    trials = [val_run(0, "softmax", 0.5, 0), val_run(1, "sparsemax", 0.5, 1)]
    confirmations = [val_run(10 + s, "softmax", 0.50 + s / 1000, s) for s in (2, 3, 4)] + \
                    [val_run(20 + s, "sparsemax", 0.60 + s / 500, s) for s in (2, 3, 4)]
    answer, plan = _answer(confirmations, ["softmax", "sparsemax"], [2, 3, 4])
    rows = {r.loss: r for r in ranking.rank(trials, confirmations, "accuracy", [], answer, plan)}
    assert rows["sparsemax"].diff.startswith("+10.") and rows["sparsemax"].diff.endswith("(val)")
    assert rows["sparsemax"].verdict == "win" and not rows["sparsemax"].test


def test_multilabel_answers_compare_with_multilabel_softmax() -> None:
    assert ranking.baseline_for("multilabel") == "multilabel_softmax"
    assert ranking.baseline_for("multiclass") == ranking.baseline_for("token") == "softmax"
    assert ranking.baseline_for("multilabel", "bce") == "bce"
    trials = [run(0, "multilabel_softmax", 0.5, 0.5, 0), run(1, "bce", 0.5, 0.5, 1)]
    confirmations = [run(10 + s, "multilabel_softmax", 0.5, 0.50 + s / 1000, s) for s in (2, 3, 4)] + \
                    [run(20 + s, "bce", 0.5, t, s)
                     for s, t in zip((2, 3, 4), (0.4515, 0.4528, 0.4536), strict=True)]
    answer, plan = _answer(confirmations, ["multilabel_softmax", "bce"], [2, 3, 4], "multilabel_softmax")
    rows = {r.loss: r for r in ranking.rank(trials, confirmations, "accuracy", [], answer, plan)}
    assert rows["bce"].diff.startswith("-5.04") and rows["bce"].verdict == "loss"
    assert rows["multilabel_softmax"].verdict == "baseline"



DEFAULTS_SPACE = """task: digits
trials_per_loss: 2
losses:
  taylor_softmax:
    params:
      n: {type: categorical, choices: [2, 4, 6]}
      backward: {type: categorical, choices: [inf, finite]}
  sparse_softmax:
    params:
      k: {type: int, low: 2, high: 9}
  as_softmax:
    params:
      delta: {type: float, low: 0.05, high: 0.5}
      warmup_r: {type: float, low: 0.05, high: 0.3}
  am_softmax:
    params:
      s: {type: float, low: 1.0, high: 30.0, log: true}
      m: {type: float, low: 0.0, high: 0.5, step: 0.25}
"""


def _searcher(tmp_path: Path, text: str, **kw: Any) -> PerLossSearcher:
    path = tmp_path / "digits.yaml"
    path.write_text(text)
    base = TrialSettings(loss="softmax", epochs=2, batch_size=32, lr=1e-3, seed=5)
    return PerLossSearcher(load_search_space(path, "multiclass"), base, f"sqlite:///{tmp_path / 'optuna.db'}",
                           "digits", "best_val_accuracy", 0, **kw)


def test_without_a_paper_setting_each_loss_starts_from_its_own_defaults_where_they_are_in_range(
        tmp_path: Path) -> None:
    from tune_as.engine.searcher import warm_start

    searcher = _searcher(tmp_path, DEFAULTS_SPACE)
    space = searcher.space.losses
    assert warm_start(space["taylor_softmax"]) == {"n": 2, "backward": "finite"}  # not a draw of backward=inf
    assert warm_start(space["sparse_softmax"]) == {}  # its default k=10 is outside [2, 9]: drawn instead
    assert warm_start(space["as_softmax"]) == {"delta": 0.3}  # warmup_r's default 0.0 is outside [0.05, 0.3]
    assert warm_start(space["am_softmax"]) == {"s": 10.0}  # m's default 0.3 is not on the 0.25 step
    first = {c["loss"]: c for c in (searcher.suggest(f"t{i}") for i in range(4)) if isinstance(c, dict)}
    assert (first["taylor_softmax"]["loss.n"], first["taylor_softmax"]["loss.backward"]) == (2, "finite")
    assert first["as_softmax"]["loss.delta"] == 0.3 and 0.05 <= first["as_softmax"]["warmup_r"] <= 0.3


FINITE_SPACE = """
task: digits
trials_per_loss: 6
losses:
  softmax:
    params: {}
  sparse_softmax:
    params:
      k: {type: int, low: 2, high: 4}
  taylor_softmax:
    params:
      n: {type: categorical, choices: [2, 4]}
      backward: {type: categorical, choices: [finite, inf]}
  as_softmax:
    params:
      delta: {type: float, low: 0.05, high: 0.5}
"""


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_setting_is_never_trained_twice_and_a_tried_out_space_ends_its_search(tmp_path: Path,
                                                                                sampler: str) -> None:
    import optuna

    searcher = _searcher(tmp_path, FINITE_SPACE, sampler=sampler)
    configs = [c for c in (searcher.suggest(f"t{i}") for i in range(30)) if isinstance(c, dict)]
    for i in range(len(configs)):  # told after every suggestion: the repeats were found among running trials
        searcher.on_trial_complete(f"t{i}", {"best_val_accuracy": 0.9})
    settings = {loss: [tuple(v for k, v in c.items() if k.startswith("loss.")) for c in configs
                       if c["loss"] == loss]
                for loss in searcher.space.losses}
    # every point of a finite space once (3 and 4 settings), no more; the continuous one and softmax get 6
    assert sorted(settings["sparse_softmax"]) == [(2,), (3,), (4,)]
    assert sorted(settings["taylor_softmax"]) == sorted([(n, b) for n in (2, 4) for b in ("finite", "inf")])
    assert len(settings["as_softmax"]) == len(set(settings["as_softmax"])) == 6
    assert [c["seed"] for c in configs if c["loss"] == "softmax"] == [5, 6, 7, 8, 9, 10]
    assert searcher.exhausted == {"sparse_softmax", "taylor_softmax"}
    assert searcher.suggest("t99") == "FINISHED"
    repeats = [t for t in searcher.study("sparse_softmax").trials if "repeat_of" in t.user_attrs]
    assert all(t.state == optuna.trial.TrialState.FAIL for t in repeats), "a repeat is not a result"
    # a restarted driver keeps knowing which losses are tried out (JSON state)
    searcher.save(str(tmp_path / "searcher.json"))
    again = _searcher(tmp_path, FINITE_SPACE, sampler=sampler)
    again.restore(str(tmp_path / "searcher.json"))
    assert again.exhausted == {"sparse_softmax", "taylor_softmax"} and again.suggest("t100") == "FINISHED"


def test_a_repeat_of_a_running_trial_is_not_trained_while_it_runs(tmp_path: Path) -> None:
    searcher = _searcher(tmp_path, FINITE_SPACE.replace("high: 4", "high: 3"))
    ks = [c["loss.k"] for c in (searcher.suggest(f"t{i}") for i in range(20))
          if isinstance(c, dict) and c["loss"] == "sparse_softmax"]
    assert sorted(ks) == [2, 3], "nothing finished yet, and still no setting twice"


def test_random_sampler_without_warm_start_draws_uniformly_from_the_same_space(tmp_path: Path) -> None:
    import optuna

    searcher = _searcher(tmp_path, DEFAULTS_SPACE, sampler="random", warm=False)
    configs = [c for c in (searcher.suggest(f"t{i}") for i in range(9)) if isinstance(c, dict)]
    assert len(configs) == 8
    assert isinstance(searcher.study("as_softmax").sampler, optuna.samplers.RandomSampler)
    assert not any(c["loss"] == "as_softmax" and c["loss.delta"] == 0.3 for c in configs), "no warm start"
    for c in configs:
        TrialSettings.from_dict(c)
    (tmp_path / "again").mkdir()
    again = _searcher(tmp_path / "again", DEFAULTS_SPACE, sampler="random", warm=False)
    assert [again.suggest(f"t{i}") for i in range(8)] == configs, "a seeded random search is repeatable"


def test_confirmed_rows_rank_above_single_runs() -> None:
    trials = [run(0, "softmax", 0.80, 0.80, 0), run(1, "sparsemax", 0.95, 0.9, 1),
              run(3, "t_softmax", 0.90, 0.99, 3, **{"loss.tau": "2.0"}),
              run(4, "t_softmax", 0.99, 0.5, 4, stopped=True, **{"loss.tau": "9.0"})]
    confirmations = [TrialRun(f"c{t.loss}{s}", "digits", t.loss, {**t.params, "seed": str(s)}, "accuracy",
                              0.9, {"test_accuracy": 0.9}) for t in trials[:2] for s in (5, 6)]
    answer, plan = _answer(confirmations, ["softmax", "sparsemax"], [5, 6])
    rows = ranking.rank(trials, confirmations, "accuracy", [], answer, plan)
    assert [r.confirmed for r in rows] == [True, True, False], "confirmed rows rank above single runs"
    assert rows[-1].loss == "t_softmax" and rows[-1].val == [0.90], "its 0.99 was stopped early: not selected"
    assert {r.loss: r.verdict for r in rows[:2]} == {"softmax": "baseline",
                                                     "sparsemax": "undecided (2 seeds)"}, \
        "equal values on every seed are no evidence (zero spread), and not an error"


# -- state files read back on --resume: JSON, never pickle ---------------------------------------------------
class Payload:
    """A pickle that creates `marker` when it is unpickled: what a planted state file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.marker), "w")


def plant(path: Path, marker: Path) -> Path:
    import pickle

    path.write_bytes(pickle.dumps({"suggested": Payload(marker), "live": {}, "next": Payload(marker)}))
    return path


def test_a_planted_pickle_as_the_scheduler_state_is_refused_and_never_run(tmp_path: Path) -> None:
    s = scheduler(tmp_path)
    assert s.state_path is not None
    plant(s.state_path, tmp_path / "ran")
    with pytest.raises(UserError,
                       match=r"scheduler\.\w+: expected the early-stopping state tune_as writes \(JSON\)"):
        s.on_trial_add(None, trial("softmax"))
    assert not (tmp_path / "ran").exists(), "the planted payload ran"


def test_a_planted_pickle_as_the_searcher_state_is_refused_and_never_run(tmp_path: Path) -> None:
    from tune_as.engine.searcher import FixedConfigs

    planted = plant(tmp_path / "searcher-state.pkl", tmp_path / "ran")
    for searcher in (_searcher(tmp_path, SPACE), FixedConfigs([], "best_val_accuracy")):
        with pytest.raises(UserError, match=r"searcher-state\.pkl: expected the searcher state tune_as "
                                            r"writes \(JSON\)"):
            searcher.restore(str(planted))
        assert not (tmp_path / "ran").exists(), \
            f"the planted payload ran in {type(searcher).__name__}.restore"


def test_searcher_state_round_trips_through_save_and_restore(tmp_path: Path) -> None:
    from tune_as.engine.searcher import FixedConfigs

    first = _searcher(tmp_path, SPACE)
    for i in range(3):
        first.suggest(f"t{i}")
    first.save(str(tmp_path / "state"))
    again = _searcher(tmp_path, SPACE)
    again.restore(str(tmp_path / "state"))
    assert (again.suggested, again.live) == (first.suggested, first.live)
    fixed = FixedConfigs([{"a": 1}, {"a": 2}], "best_val_accuracy")
    fixed.suggest("t0")
    fixed.save(str(tmp_path / "fixed"))
    restored = FixedConfigs([{"a": 1}, {"a": 2}], "best_val_accuracy")
    restored.restore(str(tmp_path / "fixed"))
    assert restored.suggest("t1") == {"a": 2}


def test_a_searcher_unpickled_from_an_older_search_gets_the_attributes_added_since(tmp_path: Path) -> None:
    """Tuner.restore unpickles the searcher a search started with: one pickled before an attribute existed
    gets its default (`_ADDED`, and the quota of the space's trials per loss), each instance its own copy."""
    import pickle

    from tune_as.engine.searcher import FixedConfigs

    searcher = _searcher(tmp_path, SPACE)
    for name in (*PerLossSearcher._ADDED, "max_concurrent"):
        searcher.__dict__.pop(name, None)
    older, other = pickle.loads(pickle.dumps(searcher)), pickle.loads(pickle.dumps(searcher))
    assert older.quota == {"softmax": 3, "as_softmax": 3} and older.max_concurrent is None
    handed = [older.suggest(f"t{i}") for i in range(7)]  # not limited, each loss its quota of 3
    assert all(isinstance(h, dict) for h in handed[:6]) and handed[6] == "FINISHED" and \
        older.exhausted == set()
    assert older.exhausted is not other.exhausted and older._ids is not other._ids
    fixed = FixedConfigs([{"a": 1}], "best_val_accuracy")
    del fixed.__dict__["live"]
    again = pickle.loads(pickle.dumps(fixed))
    assert again.suggest("t0") == {"a": 1} and again.live == {"t0"}


def test_the_searchers_keep_max_concurrent_themselves(tmp_path: Path) -> None:
    """At most max_concurrent trials live at once, counted by the searcher itself: Ray's ConcurrencyLimiter
    around it passes calls through and keeps no count (its count sits in a pickle of Ray's that a kill can
    leave out of step with Ray's trials; the searcher's own state is caught up: engine.searcher.catch_up)."""
    from ray.tune.search import ConcurrencyLimiter

    from tune_as.engine.searcher import FixedConfigs

    searcher = ConcurrencyLimiter(_searcher(tmp_path, SPACE), max_concurrent=2)
    assert all(searcher.suggest(t) for t in ("t0", "t1")) and searcher.suggest("t2") is None
    searcher.on_trial_complete("t0", {"best_val_accuracy": 0.5})
    assert isinstance(searcher.suggest("t3"), dict) and searcher.suggest("t4") is None
    assert not searcher.get_state()["live_trials"], "the limiter kept a count of its own"
    fixed = ConcurrencyLimiter(FixedConfigs([{"a": 1}, {"a": 2}], "best_val_accuracy"), max_concurrent=1)
    assert fixed.suggest("t0") == {"a": 1} and fixed.suggest("t1") is None
    fixed.on_trial_complete("t0", error=True)  # an errored trial frees its place too
    assert fixed.suggest("t2") == {"a": 2} and fixed.suggest("t3") == "FINISHED"
    assert not fixed.get_state()["live_trials"]


def test_a_searcher_state_behind_rays_trials_catches_up_before_the_restore(tmp_path: Path) -> None:
    """The searcher's state saved before its last trial was handed out, beside Ray's trials that have it (a
    kill inside Ray's copy of the two files): catch_up counts that trial and keeps its Optuna trial live, so
    the resumed searcher hands out only each loss's quota (3), never a 4th, and tells the trial's result to
    its Optuna trial; a round's FixedConfigs never hands out a saved config again. State ahead of Ray's trials
    keeps its counts (engine.run runs the lost trial in a part) but not the lost trial as live."""
    from tune_as.engine.searcher import FixedConfigs, catch_up
    from tune_as.engine.state import SEARCHER_FILES
    from tune_as.engine.storage import SavedTrial

    folder = tmp_path / "experiment"
    folder.mkdir()
    state = folder / SEARCHER_FILES.replace("*", "2026-11-29_12-00-00")
    first = _searcher(tmp_path, SPACE)
    configs = {t: first.suggest(t) for t in ("t0", "t1")}
    first.on_trial_complete("t0", {"best_val_accuracy": 0.5})
    first.save(str(state))  # the state Ray's copy left: t2 not handed out yet
    configs["t2"] = first.suggest("t2")
    trials = [SavedTrial("t0", True, configs["t0"]), SavedTrial("t1", False, configs["t1"]),
              SavedTrial("t2", False, configs["t2"])]
    assert catch_up(folder, trials, _searcher(tmp_path, SPACE)) and \
        not catch_up(folder, trials, _searcher(tmp_path, SPACE))
    resumed = _searcher(tmp_path, SPACE)
    resumed.restore(str(state))  # closes Optuna trials no live trial holds: t2's is held
    assert (resumed.suggested, resumed.live) == (first.suggested, {t: first.live[t] for t in ("t1", "t2")})
    more = [resumed.suggest(f"n{i}") for i in range(6)]
    assert Counter(c["loss"] for c in [*configs.values(), *more] if isinstance(c, dict)) == {
        "softmax": 3, "as_softmax": 3}, more
    loss, number = first.live["t2"]
    resumed.on_trial_complete("t2", {"best_val_accuracy": 0.7})
    assert resumed.study(loss).trials[number].state.name == "COMPLETE"
    # ahead: the state has a trial ("lost") that Ray's saved trials lack
    handed = {**configs, **{f"n{i}": c for i, c in enumerate(more) if isinstance(c, dict)}}
    trials = [SavedTrial(t, t in ("t0", "t2"), config) for t, config in handed.items()]
    resumed.suggested["softmax"] += 1
    resumed.live["lost"] = ("softmax", resumed.study("softmax").ask().number)
    resumed.save(str(state))
    assert catch_up(folder, trials, _searcher(tmp_path, SPACE))
    again = _searcher(tmp_path, SPACE)
    again.restore(str(state))
    assert "lost" not in again.live and again.suggested == resumed.suggested
    assert again.study("softmax").trials[resumed.live["lost"][1]].state.name == "FAIL"  # closed as an orphan
    # a round: 4 configs, Ray saved 3 (the third unfinished), the state says 2 were handed out
    fixed = FixedConfigs([{"seed": i} for i in range(4)], "best_val_accuracy")
    fixed.suggest("r0"), fixed.suggest("r1")
    fixed.save(str(state))
    saved = [SavedTrial(f"r{i}", i < 2, {"seed": i}) for i in range(3)]
    assert catch_up(folder, saved)
    restored = FixedConfigs([{"seed": i} for i in range(4)], "best_val_accuracy")
    restored.restore(str(state))
    assert restored.live == {"r2"}
    assert (restored.suggest("r3"), restored.suggest("r4")) == ({"seed": 3}, "FINISHED")


def test_a_finite_space_gets_at_most_one_search_trial_per_setting(tmp_path: Path) -> None:
    from tune_as.engine.plan import plan_search

    plan = plan_search(SearchRequest(task="digits", storage_path=tmp_path / "results", name="q",
                                     mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}", trials_per_loss=12,
                                     cache_dir=tmp_path / "cache"))
    quota = {loss: plan.quota(loss) for loss in plan.losses}
    # search_spaces/digits.yaml: k in 2..9 (8 settings), taylor_softmax n x backward (10), the rest continuous
    assert (quota["sparse_softmax"], quota["taylor_softmax"], quota["as_softmax"], quota["softmax"]) == \
        (8, 10, 12, 12)
    assert plan.n_trials == sum(quota.values())
    assert plan.quota_notes() == [f"{loss}: {n} search trials, every setting of its space once (a setting is "
                                  "never trained twice)."
                                  for loss, n in (("sparse_softmax", 8), ("taylor_softmax", 10))]


def test_the_formats_the_cli_offers_are_the_renderers() -> None:
    from tune_as.engine.request import OUTPUT_FORMATS
    from tune_as.results.render import FORMATS

    assert OUTPUT_FORMATS == FORMATS
    with pytest.raises(UserError, match="--format: expected one of table, markdown, csv, json, got 'html'"):
        SearchRequest(task="digits", output_format="html").check()


def test_the_parent_run_params_are_every_result_option_then_what_the_plan_resolved(tmp_path: Path) -> None:
    """The search's MLflow params derive from the request's declaration (request.RESULT_OPTIONS): every option
    that changes results, as asked; then the values the plan resolved (the losses it runs, the epochs, the
    margin)."""
    from tune_as.engine.plan import plan_search
    from tune_as.engine.record import parent_params
    from tune_as.engine.request import RESULT_OPTIONS

    plan = plan_search(SearchRequest(task="digits", storage_path=tmp_path / "results", name="p", race=True,
                                     mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}", max_epochs=2.0, margin=0.25,
                                     losses=("softmax", "sparsemax"), overrides=(("lr", "0.01"),),
                                     cache_dir=tmp_path / "cache"))
    params = parent_params(plan, "abc")
    unset = {k for k in RESULT_OPTIONS if getattr(plan.request, k) in (None, ())}
    assert set(RESULT_OPTIONS) - unset <= set(params), set(RESULT_OPTIONS) - unset - set(params)
    assert (params["losses"], params["max_epochs"], params["epochs"], params["overrides"]) == (
        "softmax,sparsemax", 2.0, 2.0, "lr=0.01")
    assert (params["margin"], params["race"], params["max_seeds"], params["git_commit"]) == \
        (0.25, True, 10, "abc")
    assert params["backbone"] == plan.data_settings.backbone and \
        params["trials_per_loss"] == plan.search_trials


@pytest.mark.parametrize("resume", [False, True])
def test_tune_loggers_are_off_for_a_new_search_and_left_on_for_a_resume(
        resume: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new search passes the one Tune logger it reads (result.json: engine.callbacks.common) and turns
    Tune's defaults off; a resume must leave them on: `Tuner.restore` brings back the callbacks the search
    started with, and a search started before the search passed its own logger would then write no result.json
    at all (checked by hand on 2026-11-27: a search of 8f729a4, SIGKILLed, resumed with the switch on: 3 of 6
    trials without one)."""
    from ray.tune.logger import JsonLoggerCallback

    from tune_as.engine import callbacks, cluster

    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    cluster.tune_environment(resume=resume)
    assert os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS") == (None if resume else "1")
    assert sum(isinstance(c, JsonLoggerCallback) for c in callbacks.common()) == 1


def test_the_reach_line_suggests_the_flag_of_the_searchs_own_design() -> None:
    """engine.record.reach: a race whose one look is at its first seeds (`--race --max-seeds 3`) is offered
    `--max-seeds 10`, as every race is, and judged as a race of looks 3, 5, ..., 10 (its alpha spread over
    them: its last look needs more than a fixed design's one look); `--confirm 3` is offered `--confirm 10`.
    (Before, such a race was offered --confirm 10, which the CLI refuses beside --race.) A race at 10 seeds is
    offered nothing more."""
    from tune_as.engine.record import reach
    from tune_as.results import racing

    losses, seeds = ("softmax", "a", "b"), tuple(range(3))
    race = racing.Plan(losses, "softmax", seeds, max_seeds=3)
    fixed = racing.Plan.fixed(losses, "softmax", seeds, 3)
    as_race, as_fixed = reach(race, "softmax", 20, 5, fixed=False), reach(fixed, "softmax", 20, 5, fixed=True)
    assert " --max-seeds 10 (a --budget of at most 170 trial-epochs in all) would need " in as_race, as_race
    assert " --confirm 10 (a --budget of at most 170 trial-epochs in all) would need " in as_fixed, as_fixed
    need = {line: float(line.rsplit("would need ", 1)[1].split("·s")[0]) for line in (as_race, as_fixed)}
    assert need[as_race] > need[as_fixed]
    ten = reach(racing.Plan(losses, "softmax", tuple(range(10)), max_seeds=10), "softmax", 20, 5, fixed=False)
    assert "--max-seeds" not in ten and "would need" not in ten, ten
