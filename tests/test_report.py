"""tune_as.report against a real `mlflow server`: selection, every table's rows and "-" cells, figures, the
report run, confirmation statistics, and bad input (one line, exit code 2)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port

from tune_as.report import figures as figs
from tune_as.report.build import build_report
from tune_as.report.cli import main
from tune_as.report.tables import table2, table3, table4, table6
from tune_as.results.selection import (
    TrialRun,
    row_of,
    select,
    unmatched_confirmations,
    with_confirmations,
)
from tune_as.results.verdicts import unmarked
from tune_as.tracking.schema import (
    LOSS,
    METRIC,
    MODE,
    PARENT,
    PMARGIN_FILE,
    ROLE,
    ROLE_CONFIRMATION,
    ROLE_REPORT,
    ROLE_SEARCH,
    ROLE_TRIAL,
    SEARCH,
    STOPPED_EARLY,
    TASK,
    TRIAL,
)


@dataclass
class Trial:
    loss: str
    params: dict[str, str]
    val: list[float]  # val_<metric> at evaluation points 1..n
    test: float
    steps: int  # optimizer steps at the last evaluation point
    seconds: float
    seed: int = 0
    status: str = "FINISHED"
    log_best: bool = True  # False: the run lacks best_val_<m>, the report must fall back to max(val_<m>)
    pmargin: bool = False
    stopped: bool = False  # early stopping cut it before its last epoch (tag STOPPED_EARLY)
    role: str = ROLE_TRIAL  # ROLE_CONFIRMATION: a confirmation run the search's --confirm made


def log_search(client, exp_id: str, task: str, metric: str, trials: list[Trial], tmp: Path) -> dict[str, str]:
    """A parent run and one child run per trial, exactly in the schema of docs/architecture.md."""
    from mlflow.entities import Metric, Param

    parent = client.create_run(exp_id, tags={ROLE: ROLE_SEARCH, TASK: task, METRIC: f"val_{metric}",
                                             MODE: "max", SEARCH: uuid.uuid4().hex})
    client.log_param(parent.info.run_id, "task", task)
    ids = {}
    for i, t in enumerate(trials):
        tags = {PARENT: parent.info.run_id, ROLE: t.role, TASK: task, LOSS: t.loss, TRIAL: f"t{i}",
                METRIC: f"val_{metric}"} | ({STOPPED_EARLY: "true"} if t.stopped else {})
        run = client.create_run(exp_id, tags=tags)
        rid = run.info.run_id
        n = len(t.val)
        series = {
            f"val_{metric}": t.val,
            # anti-correlated, not exactly
            "val_loss": [2.0 - v - 0.01 * (k % 2) for k, v in enumerate(t.val)],
            "masked_ratio": [0.0 if "as_" not in t.loss else 0.1 * k for k in range(1, n + 1)],
            "optimizer_steps": [t.steps * k // n for k in range(1, n + 1)],
            "train_seconds": [t.seconds * k / n for k in range(1, n + 1)],
            f"test_{metric}": [t.test] * n,
        }
        if t.log_best:
            series[f"best_val_{metric}"] = list(np.maximum.accumulate(t.val))
        params = {"task": task, "loss": t.loss, "backbone": "tiny", "encoder": "frozen", "seed": str(t.seed),
                  "epochs": "5", "batch_size": "32", "lr": "2e-05", "max_length": "32", "warmup_r": "0.0",
                  "git_commit": uuid.uuid4().hex[:8], **t.params}
        client.log_batch(rid, metrics=[Metric(k, float(v), 1_700_000_000_000 + s, s)
                                       for k, vs in series.items() for s, v in enumerate(vs, 1)],
                         params=[Param(k, v) for k, v in params.items()])
        if t.pmargin:
            path = tmp / PMARGIN_FILE
            np.save(path, np.random.default_rng(i).uniform(-1, 1, 200))
            client.log_artifact(rid, str(path))
        client.set_terminated(rid, t.status)
        ids[f"{t.role}:{t.loss}:{i}" if t.role != ROLE_TRIAL else f"{t.loss}:{i}"] = rid
    client.set_terminated(parent.info.run_id)
    return ids


# sst5: accuracy. The numbers are chosen so that each selection rule changes the answer when broken.
SST5 = [
    # softmax: lr=2e-05 has the single best run (0.55) but mean 0.50 over its two seeds; lr=5e-05 wins on
    # mean.
    Trial("softmax", {"lr": "2e-05"}, [0.40, 0.55, 0.50], 0.60, 300, 100.0, seed=0),
    Trial("softmax", {"lr": "2e-05"}, [0.40, 0.45, 0.44], 0.60, 300, 100.0, seed=1),
    Trial("softmax", {"lr": "5e-05"}, [0.45, 0.50, 0.52], 0.49, 300, 100.0, pmargin=True),
    # as_softmax: delta=0.3 has the best TEST metric, delta=0.2 the best validation metric (read from the
    # val_accuracy history: no best_val_accuracy logged); the FAILED run is best on both and must not count.
    Trial("as_softmax", {"loss.delta": "0.1", "warmup_r": "0.1"}, [0.50, 0.60, 0.58], 0.50, 290, 90.0),
    Trial("as_softmax", {"loss.delta": "0.30000000000000004", "warmup_r": "0.0"}, [0.50, 0.58, 0.57],
          0.70, 290, 90.0),
    Trial("as_softmax", {"loss.delta": "0.2", "warmup_r": "0.1"}, [0.55, 0.61, 0.60], 0.52, 280, 87.0,
          log_best=False, pmargin=True),
    Trial("as_softmax", {"loss.delta": "0.5", "warmup_r": "0.1"}, [0.90, 0.95], 0.95, 100, 30.0,
          status="FAILED"),
    # diverged
    Trial("as_softmax", {"loss.delta": "0.4", "warmup_r": "0.1"}, [math.nan, math.nan], 0.99, 100, 30.0),
    # as_speed: equal validation metric; the one with fewer optimizer steps wins although it started later.
    Trial("as_speed", {"loss.delta": "0.3", "loss.lam": "0.5", "loss.max_steps": "2"}, [0.5, 0.57],
          0.55, 250, 80.0),
    Trial("as_speed", {"loss.delta": "0.3", "loss.lam": "1.0", "loss.max_steps": "4"}, [0.5, 0.57],
          0.54, 200, 78.0),
    # stopped early with the best validation metric of all: it trained fewer epochs and must not win.
    Trial("as_softmax", {"loss.delta": "0.25", "warmup_r": "0.1"}, [0.70, 0.90], 0.91, 100, 30.0,
          stopped=True),
    # label_smoothing: every trial stopped early: no result, the tables say so.
    Trial("label_smoothing", {"loss.eps": "0.1"}, [0.30, 0.35], 0.33, 100, 30.0, stopped=True),
    Trial("label_smoothing", {"loss.eps": "0.2"}, [0.30, 0.36], 0.34, 100, 30.0, stopped=True),
    # the search's --confirm: the selected softmax setting (lr=5e-05) with new seeds 10 and 11; Table 2 shows
    # their mean ± std. A confirmation of an as_softmax setting that is not the selected one is ignored.
    Trial("softmax", {"lr": "5e-05"}, [0.45, 0.51, 0.50], 0.50, 300, 100.0, seed=10, role=ROLE_CONFIRMATION),
    Trial("softmax", {"lr": "5e-05"}, [0.45, 0.52, 0.53], 0.54, 300, 100.0, seed=11, role=ROLE_CONFIRMATION),
    Trial("as_softmax", {"loss.delta": "0.30000000000000004", "warmup_r": "0.0"}, [0.5, 0.6], 0.99, 290, 90.0,
          seed=10, role=ROLE_CONFIRMATION),
]
# conll2003: f1, only softmax and t_softmax: the AS rows must show "-" in this column.
CONLL = [
    Trial("softmax", {}, [0.80, 0.85, 0.90], 0.88, 600, 200.0),
    Trial("t_softmax", {"loss.tau": "0.5"}, [0.80, 0.86, 0.89], 0.87, 600, 230.0),
    Trial("t_softmax", {"loss.tau": "2.0"}, [0.70, 0.80, 0.91], 0.86, 600, 220.0),
]


@dataclass
class Store:
    uri: str
    experiments: list[str]
    runs: dict[str, str]


@pytest.fixture(scope="module")
def store(mlflow_server, tmp_path_factory: pytest.TempPathFactory) -> Store:
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    tmp = tmp_path_factory.mktemp("report-store")
    suffix = uuid.uuid4().hex[:6]
    names = [f"report-sst5-{suffix}", f"report-conll-{suffix}"]
    runs = log_search(client, client.create_experiment(names[0]), "sst5", "accuracy", SST5, tmp)
    runs |= log_search(client, client.create_experiment(names[1]), "conll2003", "f1", CONLL, tmp)
    return Store(mlflow_server.uri, names, runs)


@pytest.fixture(scope="module")
def report(store: Store, tmp_path_factory: pytest.TempPathFactory):
    import optuna

    tmp = tmp_path_factory.mktemp("report")
    storage = tmp / "optuna.db"
    study = optuna.create_study(study_name="sst5-as_softmax", storage=f"sqlite:///{storage}",
                                direction="maximize")
    study.optimize(lambda trial: trial.suggest_float("delta", 0.05, 0.5), n_trials=3)
    return build_report(store.experiments, tmp / "out", store.uri, optuna_storage=storage)


def table(report, name: str) -> dict[str, dict[str, str]]:
    """A table as {row: {column: cell}}."""
    t = next(t for t in report.tables if t.name == name)
    return {row[0]: dict(zip(t.header[1:], row[1:], strict=True)) for row in t.rows}


@pytest.mark.slow
def test_selection_uses_mean_validation_metric_never_test(report, store: Store) -> None:
    cells = report.cells
    # as_softmax: best validation (0.61, from the val history) is delta=0.2; best test (0.70) is delta=0.3.
    # The stopped run (0.90) is better still, but it trained fewer epochs: it does not compete.
    assert cells["sst5", "as_softmax"].params["loss.delta"] == "0.2"
    assert cells["sst5", "as_softmax"].n_trials == 4  # the FAILED and the diverged (NaN) run are left out
    assert cells["sst5", "as_softmax"].n_stopped == 1
    # softmax: repeats of one setting are averaged: lr=5e-05 (0.52) beats lr=2e-05 (mean 0.50, best seed
    # 0.55).
    assert cells["sst5", "softmax"].params["lr"] == "5e-05"
    assert sorted(r.run_id for r in cells["sst5", "softmax"].runs) == [store.runs["softmax:2"]]
    # as_speed: equal validation metric, fewer optimizer steps wins.
    assert cells["sst5", "as_speed"].params["loss.lam"] == "1.0"
    assert cells["conll2003", "t_softmax"].params["loss.tau"] == "2.0"


@pytest.mark.slow
def test_tables_rows_and_missing_cells(report) -> None:
    t6 = table(report, "table6")
    assert list(t6)[:9] == ["softmax", "t_softmax", "sparse_softmax", "sparsemax", "entmax15",
                            "label_smoothing", "am_softmax", "as_softmax", "as_speed"]
    assert list(t6["softmax"]) == ["sst5", "conll2003"]  # the paper's column order
    assert t6["as_softmax"] == {"sst5": "delta=0.2, warmup_r=0.1 [4 trials, 1 stopped early]",
                                "conll2003": "-"}
    assert t6["label_smoothing"] == {"sst5": "stopped early [2 trials, none completed]", "conll2003": "-"}
    assert t6["softmax"]["sst5"] == "lr=5e-05 [3 trials]"
    assert t6["as_speed"]["sst5"] == "delta=0.3, lam=1, max_steps=4 [2 trials]"
    assert t6["sparsemax"] == {"sst5": "-", "conll2003": "-"}

    t2 = table(report, "table2")
    # unconfirmed cells are the selected run's number, marked †
    assert t2["as_softmax"] == {"sst5 accuracy": "52.00†", "conll2003 f1": "-"}
    # sst5 softmax: the search's two confirmation runs (test 0.50, 0.54), not the selected trial (0.49)
    assert t2["softmax"] == {"sst5 accuracy": f"52.00 ± {100 * np.std([0.50, 0.54], ddof=1):.2f} (n=2)",
                             "conll2003 f1": "88.00†"}
    assert t2["t_softmax"] == {"sst5 accuracy": "-", "conll2003 f1": "86.00†"}
    assert t2["label_smoothing"] == {"sst5 accuracy": "stopped early", "conll2003 f1": "-"}
    assert "† not confirmed" in (report.out / "table2.md").read_text()
    conf = table(report, "confirmation")  # shown because the search confirmed; no --confirm needed
    assert conf["softmax"]["sst5 test_accuracy mean ± std"].endswith("(n=2)")
    assert "as_softmax" not in conf

    t3 = table(report, "table3")
    assert t3["softmax"] == {"sst5": "100", "conll2003": "200"}
    assert t3["as_softmax"] == {"sst5": "-13%", "conll2003": "-"}
    assert t3["t_softmax"] == {"sst5": "-", "conll2003": "+10%"}
    assert t3["label_smoothing"]["sst5"] == "stopped early"

    t4 = table(report, "table4")
    val = np.array(SST5[5].val)
    loss = 2.0 - val - 0.01 * (np.arange(3) % 2)
    assert t4["as_softmax"]["sst5"] == f"{np.corrcoef(loss, val)[0, 1]:.3f}"
    assert float(t4["softmax"]["conll2003"]) < -0.9
    assert t4["am_softmax"] == {"sst5": "-", "conll2003": "-"}
    assert t4["label_smoothing"]["sst5"] == "stopped early"


@pytest.mark.slow
def test_files_figures_and_report_run(report, store: Store) -> None:
    from mlflow import MlflowClient

    out = report.out
    for name in ("table6", "table2", "table3", "table4"):
        assert (out / f"{name}.md").read_text().count("\n| ") == 2 + 9  # header, separator, the 9 paper rows
        assert (out / f"{name}.csv").read_text().splitlines()[0].startswith("loss,")
    selection = {(r["task"], r["row"]): r for r in csv.DictReader((out / "selection.csv").open())}
    assert set(selection) == set(report.cells)
    assert selection["sst5", "softmax"]["run_ids"] == store.runs["softmax:2"]
    assert sorted(selection["sst5", "softmax"]["confirmation_run_ids"].split()) == sorted(
        rid for key, rid in store.runs.items() if key.startswith(f"{ROLE_CONFIRMATION}:softmax:"))
    assert selection["sst5", "label_smoothing"]["stopped_early"] == "True"
    assert float(selection["sst5", "as_softmax"]["val_mean"]) == pytest.approx(0.61)
    assert json.loads(selection["sst5", "as_speed"]["params"])["loss.lam"] == "1.0"
    pngs = {p.name for p in out.glob("*.png")}
    assert {"fig1_masked_ratio_sst5.png", "fig2_delta_sst5.png", "fig3_curves_sst5.png",
            "fig4_pmargin_sst5.png", "fig3_curves_conll2003.png",
            "optuna_history_sst5-as_softmax.png"} <= pngs
    assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    # conll2003 has no AS-Softmax trials: figures 1 and 2 say so instead of drawing empty axes.
    assert any(n.startswith("figure 1 (conll2003): skipped") for n in report.notes)
    assert "fig1_masked_ratio_conll2003.png" not in pngs

    client = MlflowClient(store.uri)
    run = client.get_run(report.report_run_id)
    assert run.data.tags[ROLE] == ROLE_REPORT
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/table6.csv", "report/selection.csv", "report/fig4_pmargin_sst5.png",
            "report/report.md"} <= logged


@pytest.mark.slow
def test_cli_prints_tables_and_optuna_note(store: Store, tmp_path: Path, capsys) -> None:
    rc = main(["--experiment", store.experiments[0], "--tracking-uri", store.uri, "--out",
               str(tmp_path / "o"), "--optuna-storage", str(tmp_path / "absent.db")])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "Table 6" in printed and "Table 4" in printed
    assert "optuna view: skipped, no Optuna study file" in printed


BAD_INPUT = [
    ("unknown experiment", lambda s, tmp: ["--experiment", "no-such-experiment", "--tracking-uri", s.uri],
     "expected an MLflow experiment named 'no-such-experiment'"),
    ("empty experiment", lambda s, tmp: ["--experiment", s.empty, "--tracking-uri", s.uri],
     "expected finished trial runs"),
    ("unreachable server", lambda s, tmp: ["--experiment", "x", "--tracking-uri",
                                           f"http://127.0.0.1:{free_port()}"],
     "expected a reachable MLflow tracking server"),
    ("unreachable server, password in URI",
     lambda s, tmp: ["--experiment", "x", "--tracking-uri", f"http://alice:s3cret@127.0.0.1:{free_port()}"],
     "expected a reachable MLflow tracking server at http://alice:***@127.0.0.1:"),
    ("unreachable database, password in URI",
     lambda s, tmp: ["--experiment", "x", "--tracking-uri",
                     f"postgresql+psycopg2://alice:s3cret@127.0.0.1:{free_port()}/m"],
     "MLflow tracking URI postgresql+psycopg2://alice:***@127.0.0.1:"),
    ("missing sqlite file", lambda s, tmp: ["--experiment", "x", "--tracking-uri",
                                            f"sqlite:///{tmp}/none.db"],
     "expected an MLflow SQLite store"),
    ("negative --confirm", lambda s, tmp: ["--experiment", "x", "--confirm", "-1"],
     "--confirm: expected 0 or at least 2 seeds"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "argv", "expected"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_one_line_exit_2(case, argv, expected, store: Store, tmp_path: Path, capsys) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(store.uri)
    store.empty = f"report-empty-{uuid.uuid4().hex[:6]}"
    exp = client.create_experiment(store.empty)
    client.set_terminated(client.create_run(exp, tags={ROLE: ROLE_SEARCH}).info.run_id)  # a parent, no trials
    out = tmp_path / "out"
    rc = main([*argv(store, tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
    assert ("received" in err or "got" in err) and "s3cret" not in err
    assert not out.exists()  # nothing written on bad input


def test_multilabel_losses_share_the_paper_rows() -> None:
    assert row_of("multilabel_as_softmax", {"multilabel_as_softmax", "bce"}) == "as_softmax"
    assert row_of("multilabel_as_softmax", {"multilabel_as_softmax", "as_softmax"}) == "multilabel_as_softmax"
    assert row_of("bce", {"bce"}) == "bce"


# -- from a real search ----------------------------------------------------------------------------------
@dataclass
class RealSearch:
    uri: str
    experiment: str
    storage: Path


@pytest.fixture(scope="module")
def real_search(mlflow_server, ray_local, tmp_path_factory: pytest.TempPathFactory) -> RealSearch:
    """A real short search (Ray, Optuna, MLflow callback): digits, softmax and as_softmax, 2 trials each."""
    from tune_as.search import main as search

    tmp = tmp_path_factory.mktemp("real-search")
    name = f"report-real-{uuid.uuid4().hex[:6]}"
    rc = search(["--task", "digits", "--smoke", "--losses", "softmax,as_softmax", "--trials-per-loss", "2",
                 "--eval-every-steps", "2", "--no-asha", "--mlflow-uri", mlflow_server.uri, "--experiment",
                 name, "--storage-path", str(tmp / "results")])
    assert rc == 0
    return RealSearch(mlflow_server.uri, name, tmp / "results")


@pytest.mark.slow
def test_report_from_a_real_search(real_search: RealSearch, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    report = build_report([real_search.experiment], tmp_path / "out", real_search.uri,
                          optuna_storage=real_search.storage)
    client = MlflowClient(real_search.uri)
    exp = client.get_experiment_by_name(real_search.experiment)
    children = client.search_runs([exp.experiment_id], f"tags.`{ROLE}` = '{ROLE_TRIAL}'")
    by_loss = {loss: [r for r in children if r.data.tags[LOSS] == loss] for loss in ("softmax", "as_softmax")}
    assert all(len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"} for runs in by_loss.values())

    t6, t2, t4 = table(report, "table6"), table(report, "table2"), table(report, "table4")
    assert set(report.cells) == {("digits", "softmax"), ("digits", "as_softmax")}
    assert {row for row, cells in t6.items() if cells["digits"] != "-"} == {"softmax", "as_softmax"}
    # softmax has no hyper-parameters: its two trials are repeats of one setting, averaged.
    assert t6["softmax"]["digits"] == "defaults [2 trials, mean of 2 runs]"
    test_mean = np.mean([r.data.metrics["test_accuracy"] for r in by_loss["softmax"]])
    assert t2["softmax"]["digits accuracy"] == f"{100 * test_mean:.2f}†"  # not confirmed yet
    # as_softmax: the selected run is one with the best validation accuracy, and Table 2 shows its test
    # accuracy.
    chosen = report.cells["digits", "as_softmax"].runs[0]
    assert chosen.best_val == max(r.data.metrics["best_val_accuracy"] for r in by_loss["as_softmax"])
    assert t6["as_softmax"]["digits"].startswith(f"delta={float(chosen.params['loss.delta']):.3g}")
    assert t2["as_softmax"]["digits accuracy"] == f"{100 * chosen.last['test_accuracy']:.2f}†"
    # 2 epochs x 8 steps, evaluated every 2 steps: enough points for a correlation.
    assert -1.0 <= float(t4["as_softmax"]["digits"]) <= 1.0
    assert {p.name for p in report.figures} == {
        "fig1_masked_ratio_digits.png", "fig2_delta_digits.png", "fig3_curves_digits.png",
        "fig4_pmargin_digits.png", "optuna_history_digits-as_softmax.png"}


@pytest.mark.slow
def test_confirm_reruns_selected_settings_with_new_seeds(real_search: RealSearch, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from tune_as.engine import SearchRequest

    placement = SearchRequest(task="", storage_path=tmp_path / "results")
    report = build_report([real_search.experiment], tmp_path / "out", real_search.uri, confirm_seeds=2,
                          optuna_storage=real_search.storage, placement=placement)
    client = MlflowClient(real_search.uri)
    exp = client.get_experiment_by_name(real_search.experiment)
    trial_seeds = {r.data.params["seed"] for r in client.search_runs([exp.experiment_id],
                                                                     f"tags.`{ROLE}` = '{ROLE_TRIAL}'")}
    confirmations = client.search_runs([exp.experiment_id], f"tags.`{ROLE}` = '{ROLE_CONFIRMATION}'")
    assert len(confirmations) == 4  # 2 losses x 2 seeds
    seeds = {r.data.params["seed"] for r in confirmations}
    assert len(seeds) == 2 and not seeds & trial_seeds
    for (_, row), c in report.confirmations.items():
        assert sorted(c.by_seed) == sorted(seeds)
        assert c.row == row
    conf = table(report, "confirmation")
    column = "digits Δ vs softmax [simultaneous interval] verdict"
    assert conf["softmax"][column] == "reference"
    assert conf["as_softmax"]["digits test_accuracy mean ± std"].rstrip("*").endswith("(n=2)")  # * best set
    a, b = report.confirmations["digits", "as_softmax"], report.confirmations["digits", "softmax"]
    diff = np.mean([a.by_seed[s] - b.by_seed[s] for s in seeds])
    assert conf["as_softmax"][column].startswith(f"{100 * diff:+.2f} ")
    assert unmarked(conf["as_softmax"][column]).endswith(
        ("win", "loss", "equivalent", "undecided (2 seeds)")), "the search's words (a step-down mark allowed)"
    # Table 2 now shows the confirmed numbers
    softmax_tests = list(b.by_seed.values())
    assert table(report, "table2")["softmax"]["digits accuracy"] == (
        f"{100 * np.mean(softmax_tests):.2f} ± {100 * np.std(softmax_tests, ddof=1):.2f} (n=2)")
    # a second --confirm reuses the runs already logged for those seeds instead of training again
    build_report([real_search.experiment], tmp_path / "again", real_search.uri, confirm_seeds=2,
                 placement=placement)
    assert len(client.search_runs([exp.experiment_id], f"tags.`{ROLE}` = '{ROLE_CONFIRMATION}'")) == 4


def run(i: int, lr: str, best: float, stopped: bool = False, *, loss: str = "softmax",
        seed: int | None = None, test: float = 0.5, params: dict[str, str] | None = None) -> TrialRun:
    """A TrialRun as the report reads it from MLflow (no server needed for the selection rules)."""
    return TrialRun(f"r{i}", "sst5", loss, {"loss": loss, "lr": lr, "seed": str(i if seed is None else seed),
                                            **(params or {})}, "accuracy", best,
                    {"optimizer_steps": 10.0, "train_seconds": 5.0, "test_accuracy": test}, start_time=i,
                    stopped_early=stopped)


def test_the_report_reads_the_fractions_not_the_copies_in_percent(tmp_path: Path) -> None:
    """A run logs its headline metrics again in percent for a person (`schema.with_percent`); the report reads
    the fractions it always read: no `accuracy_pct` test column, no percent of a percent, the same replay."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from tune_as.report.answers import engine_run
    from tune_as.report.runs import trial_runs
    from tune_as.tracking.schema import fractions, with_percent

    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.create_experiment("pct")
    reported = {"best_val_accuracy": 0.75, "test_accuracy": 0.625, "val_accuracy": 0.75, "epoch": 2.0}
    rid = client.create_run(exp, tags={ROLE: ROLE_TRIAL, TASK: "sst5", LOSS: "softmax", TRIAL: "t1",
                                       METRIC: "val_accuracy"}).info.run_id
    client.log_batch(rid, metrics=[Metric(k, v, 0, 2) for k, v in with_percent(reported).items()],
                     params=[Param(k, v) for k, v in {"task": "sst5", "loss": "softmax", "epochs": "2.0",
                                                      "batch_size": "8", "lr": "0.001", "seed": "0"}.items()])
    client.set_terminated(rid)
    run = client.get_run(rid)
    assert run.data.metrics["test_accuracy_pct"] == 62.5  # what the MLflow UI shows
    (read,) = trial_runs(client, [exp], ROLE_TRIAL, [])
    assert read.last == reported and read.test_metrics() == {"accuracy": 0.625}
    replayed = engine_run(run, "accuracy", True)
    assert replayed is not None and replayed.last == fractions(run.data.metrics) == reported


def test_runs_stopped_early_never_compete_with_completed_ones() -> None:
    """Setting A: one completed seed at 0.80 and one stopped at 0.30; setting B: completed at 0.70; setting C:
    stopped at 0.95. Averaging the stopped run in would pick B (0.55 < 0.70), letting C compete would pick a
    run that trained fewer epochs; among completed runs A wins."""
    cells = select([run(0, "1e-3", 0.80), run(1, "1e-3", 0.30, True), run(2, "3e-3", 0.70),
                    run(3, "1e-2", 0.95, True)])
    cell = cells[("sst5", "softmax")]
    assert cell.params["lr"] == "1e-3" and cell.val == pytest.approx(0.80) and not cell.stopped_early
    assert (cell.n_trials, cell.n_stopped) == (4, 2)
    assert table6(cells).rows[0][1] == "lr=0.001 [4 trials, 2 stopped early]"


def test_a_cell_whose_runs_were_all_stopped_early_shows_no_number() -> None:
    cells = select([run(0, "1e-3", 0.4, True), run(1, "3e-3", 0.5, True),
                    run(2, "1e-3", 0.9, loss="as_softmax")])
    stopped = cells[("sst5", "softmax")]
    # the best stopped run, kept for the figures
    assert stopped.stopped_early and stopped.params["lr"] == "3e-3"
    histories = {r.run_id: {"val_loss": [(1, 1.0), (2, 0.5), (3, 0.2)],
                            "val_accuracy": [(1, 0.1), (2, 0.3), (3, 0.6)]}
                 for c in cells.values() for r in c.runs}
    rows = {t.name: {row[0]: row[1] for row in t.rows}
            for t in (table6(cells), table2(cells), table3(cells), table4(cells, histories))}
    assert rows["table6"]["softmax"] == "stopped early [2 trials, none completed]"
    assert rows["table2"]["softmax"] == rows["table3"]["softmax"] == rows["table4"]["softmax"] == \
        "stopped early"
    # as_softmax completed: numbers; and its time is absolute, not relative to a softmax that has no result
    assert rows["table2"]["as_softmax"] == "50.00†" and rows["table3"]["as_softmax"] == "5.0s"
    # confirmation runs that happen to match a stopped cell's setting do not turn it into a result
    confirmed = with_confirmations(cells, [run(10, "3e-3", 0.6, seed=10)])
    assert confirmed["sst5", "softmax"].confirmations == ()


def test_table2_shows_confirmed_mean_and_std_and_marks_unconfirmed_cells() -> None:
    cells = select([run(0, "1e-3", 0.80, test=0.70), run(1, "3e-3", 0.70),
                    run(2, "1e-3", 0.80, loss="as_softmax", test=0.75, params={"loss.delta": "0.2"})])
    confirmations = [
        run(10, "1e-3", 0.79, seed=10, test=0.60),  # the search's --confirm, seed 10 ...
        run(11, "1e-3", 0.81, seed=11, test=0.64),
        run(12, "1e-3", 0.80, seed=11, test=0.66),  # ... and a later run of seed 11 (the report's): it wins
        run(13, "3e-3", 0.70, seed=10, test=0.99),  # another softmax setting: not the selected one
        # another δ
        run(14, "1e-3", 0.80, seed=10, test=0.99, loss="as_softmax", params={"loss.delta": "0.3"}),
    ]
    cells = with_confirmations(cells, confirmations)
    assert [r.run_id for r in cells["sst5", "softmax"].confirmations] == ["r10", "r12"]
    assert cells["sst5", "as_softmax"].confirmations == ()
    # what is left out is said (a deleted selected run would leave its confirmations matching nothing)
    assert unmatched_confirmations(cells, confirmations) == [
        "1 confirmation run(s) of sst5 x as_softmax confirm no selected setting (its trial run may have been "
        "deleted, or another setting is selected now): left out",
        "1 confirmation run(s) of sst5 x softmax confirm no selected setting (its trial run may have been "
        "deleted, or another setting is selected now): left out"]
    t2 = {row[0]: row[1] for row in table2(cells).rows}
    assert t2["softmax"] == f"63.00 ± {100 * np.std([0.60, 0.66], ddof=1):.2f} (n=2)"
    assert t2["as_softmax"] == "75.00†"  # the single selected run, not confirmed
    assert t2["sparsemax"] == "-"
    assert any("† not confirmed" in note for note in table2(cells).notes)


# -- figures: what a reader sees, read from the artists (no pixel comparisons) ----------------------------
def curves(cells, metric: str = "accuracy") -> dict:
    steps = [(k, float(10 * k)) for k in range(1, 4)]
    return {r.run_id: {"optimizer_steps": steps, f"val_{metric}": [(1, 0.2), (2, 0.4), (3, 0.5)],
                       "val_loss": [(1, 1.0), (2, 0.6), (3, 0.5)],
                       "masked_ratio": [(1, 0.0), (2, 0.2), (3, 0.4)]}
            for c in cells.values() for r in c.runs}


def lines_by_label(drawing: figs.Drawing, ax: int = 0) -> dict:
    return {line.get_label(): line for line in drawing.figure.axes[ax].get_lines()}


def legend_outside(drawing: figs.Drawing) -> bool:
    """Every legend's box starts right of the axes it belongs to: nothing is drawn over the data."""
    legends = [(ax, ax.get_legend()) for ax in drawing.figure.axes if ax.get_legend() is not None]
    return bool(legends) and all(leg.get_window_extent().x0 >= ax.get_window_extent().x1
                                 for ax, leg in legends)


@pytest.mark.slow
def test_fig2_draws_stopped_trials_hollow_and_grey(tmp_path: Path) -> None:
    trials = [run(0, "1e-3", 0.80, loss="as_softmax", params={"loss.delta": "0.1"}),
              run(1, "1e-3", 0.30, True, loss="as_softmax", params={"loss.delta": "0.2"}),
              run(2, "1e-3", 0.85, loss="as_softmax", params={"loss.delta": "0.3"}),
              run(3, "1e-3", 0.35, True, loss="as_softmax", params={"loss.delta": "0.4"})]
    drawing = figs.fig2_delta("sst5", trials, tmp_path)
    assert isinstance(drawing, figs.Drawing) and drawing.path.read_bytes()[:4] == b"\x89PNG"
    assert sorted(drawing.stopped) == ["r1", "r3"]
    from matplotlib.colors import to_rgba

    for ax in drawing.figure.axes:  # validation and test panels
        done, stopped = ax.collections
        assert [tuple(p) for p in done.get_offsets()][:1] == \
            [(0.1, pytest.approx(80.0 if ax is drawing.figure.axes[0] else 50.0))]  # in points
        assert len(done.get_offsets()) == len(stopped.get_offsets()) == 2
        assert tuple(done.get_facecolors()[0]) == to_rgba(figs.style("as_softmax").colour)  # filled
        assert stopped.get_facecolors().size == 0 or stopped.get_facecolors()[0][3] == 0  # hollow
        assert tuple(stopped.get_edgecolors()[0]) == to_rgba(figs.STOPPED_COLOUR)  # grey outline
    labels = [t.get_text() for t in drawing.figure.axes[1].get_legend().get_texts()]
    assert labels == ["completed its epochs (2)", "stopped early (2): trained fewer epochs"]
    assert legend_outside(drawing)


@pytest.mark.slow
def test_curve_figures_keep_one_style_per_loss_and_mark_stopped_cells(tmp_path: Path) -> None:
    cells = select([run(0, "1e-3", 0.8), run(1, "1e-3", 0.9, loss="as_softmax", params={"loss.delta": "0.2"}),
                    run(2, "1e-3", 0.7, True, loss="as_speed", params={"loss.delta": "0.2"}),
                    run(3, "1e-3", 0.6, loss="sparsemax")])
    histories = curves(cells)
    fig1 = figs.fig1_masked_ratio("sst5", cells, histories, tmp_path)
    fig3 = figs.fig3_curves("sst5", cells, histories, tmp_path)
    assert isinstance(fig1, figs.Drawing) and isinstance(fig3, figs.Drawing)
    assert fig1.stopped == fig3.stopped == ("r2",)
    for drawing in (fig1, fig3):
        lines = lines_by_label(drawing)
        for row in ("softmax", "as_softmax"):  # completed: the loss's colour and marker, filled
            assert (lines[row].get_color(), lines[row].get_marker()) == \
                (figs.style(row).colour, figs.style(row).marker)
            assert lines[row].get_markerfacecolor() == lines[row].get_color() and \
                lines[row].get_linestyle() == "-"
        speed = lines["as_speed (stopped early)"]  # the stopped cell: same colour, hollow and dashed, named
        assert speed.get_color() == figs.style("as_speed").colour
        assert speed.get_markerfacecolor() == "none" and speed.get_linestyle() == "--"
        assert legend_outside(drawing)
    assert set(lines_by_label(fig3)) == {"softmax", "sparsemax", "as_softmax", "as_speed (stopped early)"}
    assert "sparsemax" not in lines_by_label(fig1)  # Figure 1 is about the masking losses and softmax


def test_fig4_marks_a_stopped_selected_run(tmp_path: Path) -> None:
    cells = select([run(0, "1e-3", 0.8, True),
                    run(1, "1e-3", 0.9, loss="as_softmax", params={"loss.delta": "0.2"})])
    margins = {"softmax": np.linspace(-1, 1, 50), "as_softmax": np.linspace(-0.5, 1, 50)}
    drawing = figs.fig4_pmargin("sst5", cells, margins, tmp_path)
    assert isinstance(drawing, figs.Drawing) and drawing.stopped == ("r0",)
    labels = [t.get_text() for t in drawing.figure.axes[0].get_legend().get_texts()]
    assert "softmax (n=50), stopped early" in labels and "δ = 0.2 (as_softmax)" in labels
    assert legend_outside(drawing)
    assert drawing.figure.axes[0].get_xlabel() == "p_margin = p_t − max non-target p"


def test_fig4_of_a_multilabel_task_draws_eq14_and_eq18_with_their_margin(tmp_path: Path) -> None:
    cells = select([dataclasses.replace(r, task="eurlex") for r in (
        run(0, "1e-3", 0.8, loss="multilabel_softmax"),
        run(1, "1e-3", 0.9, loss="multilabel_as_softmax", params={"loss.delta": "0.3"}))])
    margins = {"softmax": np.linspace(-1, 1, 40), "as_softmax": np.linspace(-0.5, 1, 40)}  # the paper's rows
    drawing = figs.fig4_pmargin("eurlex", cells, margins, tmp_path)
    assert isinstance(drawing, figs.Drawing)
    labels = [t.get_text() for t in drawing.figure.axes[0].get_legend().get_texts()]
    assert "multilabel_softmax (n=40)" in labels and "δ = 0.3 (multilabel_as_softmax)" in labels
    assert drawing.figure.axes[0].get_xlabel() == "p_margin = min positive p − max negative p"


def test_every_loss_has_its_own_colour_blind_safe_style_in_every_figure() -> None:
    from tune_as.losses import LOSSES

    styles = {loss: figs.style(loss) for loss in LOSSES}
    assert len(set(styles.values())) == len(styles)  # no two losses look alike
    assert len({s.colour for s in styles.values()}) == len(styles), "every loss a colour of its own"
    assert {s.colour for s in styles.values()} <= set(figs.PALETTE)
    assert figs.STOPPED_COLOUR not in figs.PALETTE
    # the paper's protagonists get three different colours, not just different markers
    assert len({figs.style(loss).colour for loss in ("softmax", "as_softmax", "as_speed")}) == 3
    # a loss's style does not depend on which other losses a figure shows, nor on the process
    assert figs.style("no_longer_registered") == figs.style("no_longer_registered")


def test_bad_places_and_options_are_one_line_before_any_work(tmp_path: Path, capsys) -> None:
    """--out at a file, --optuna-storage that is not a database, an unknown option: one line, exit 2, checked
    before the tracking store is read or anything drawn."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    cases = [
        (["--out", str(a_file / "report")],
         "error: --out: expected a folder (or a path that can become one)"),
        (["--out", "/proc/tune_as_report"], "error: --out: expected a writable place"),
        (["--out", str(tmp_path / "out"), "--optuna-storage", str(a_file)],
         "error: --optuna-storage: expected an SQLite database (an Optuna study file) or a folder"),
        (["--no-such-option"], "error: unrecognized arguments: --no-such-option"),
    ]
    for extra, expected in cases:
        rc = main(["--experiment", "x", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(expected) and err.count("\n") == 1, (extra, err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "none.db").exists()


def test_the_optuna_figure_of_a_multilabel_task_is_its_multilabel_as_softmax_study() -> None:
    """The report's Optuna history figure draws the study of the task's AS-Softmax row, named by the loss its
    runs trained: Eq. 18's on a multi-label task, whose row is the paper's as_softmax once selected (the
    eurlex study's report said 'expected study eurlex-as_softmax' and drew none; a test on hand-keyed cells
    missed it)."""
    from tune_as.report.build import as_softmax_study

    eurlex = [dataclasses.replace(r, task="eurlex") for r in (
        run(0, "1e-3", 0.8, loss="multilabel_softmax"), run(1, "1e-3", 0.9, loss="multilabel_as_softmax"))]
    cells = select([*eurlex, run(2, "1e-3", 0.7, loss="as_softmax")])
    assert ("eurlex", "as_softmax") in cells  # the paper's row (results.selection.row_of)
    assert (as_softmax_study(cells, "eurlex"), as_softmax_study(cells, "sst5")) == \
        ("eurlex-multilabel_as_softmax", "sst5-as_softmax")
    assert as_softmax_study({}, "digits") == "digits-as_softmax"
