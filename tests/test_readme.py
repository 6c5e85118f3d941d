"""The README's commands are real: the newcomer's search and the report run as written (offline, in a scratch
folder), and every other `python -m tune_as.*` command parses with the real CLI."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tune_as import search
from tune_as.report import cli as report
from tune_as.results.verdicts import unmarked

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
# the options' page holds the README's other commands: they parse with the real CLI too
SEARCH_DOC = (REPO / "docs" / "search.md").read_text()


def _commands(module: str, text: str = README) -> list[list[str]]:
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if "-m" in words and words[words.index("-m") + 1] == module:
                    found.append(words[words.index("-m") + 2:])
    return found


def test_first_lines_are_setup_and_test_commands() -> None:
    setup, tests = BLOCKS[0].strip().splitlines()
    assert setup.startswith("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0")
    assert ".venv/bin/python -m tune_as.search --task digits" in setup
    assert tests == ".venv/bin/python -m pytest"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    # CI runs exactly that command (its exit status kept for CI's own: `|| status=$?`), and exits with it
    assert ".venv/bin/python -m pytest || status=$?" in ci and ci[-1] == 'exit "$status"', ci[-6:]


@pytest.mark.parametrize(("module", "parser"), [("tune_as.search", search.build_parser),
                                                ("tune_as.report", report.build_parser)])
def test_every_readme_command_parses(module: str, parser) -> None:
    commands = _commands(module) + _commands(module, SEARCH_DOC)
    assert _commands(module, SEARCH_DOC), f"no {module} command in docs/search.md"
    for argv in commands:
        parser().parse_args(argv)  # exits (SystemExit) on an unknown or malformed option


@pytest.mark.slow
def test_newcomer_search_and_report_run_as_written(tmp_path: Path) -> None:
    """The first command's search and the report, verbatim, in an empty folder: local Ray, SQLite MLflow, and
    a home folder as a fresh machine's (no ~/.ray: the search writes the token its Ray asks for)."""
    search_argv = next(a for a in _commands("tune_as.search") if a[:2] == ["--task", "digits"])
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "TUNE_AS_CACHE": str(tmp_path / "cache"), "COLUMNS": "100", "HOME": str(home)}
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "tune_as.search", *search_argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "snapshotting" not in run.stdout + run.stderr, "Ray's snapshot warning is back"
    assert "Ray: wrote a new token to ~/.ray/auth_token" in run.stdout, run.stdout[:600]
    token = home / ".ray" / "auth_token"
    assert len(token.read_text()) == 64 and token.stat().st_mode & 0o077 == 0, "the token is the user's alone"
    # The progress view, on stderr (stdout: the answer): a block per phase as it ends, one line per loss,
    # within 100 columns (Ray's wide per-trial table only with --verbose)
    blocks = [b for b in run.stderr.split("\n\n")
              if re.search(r"^(search|confirmation round \d+ of [^:]+): \d+/\d+ trials ended", b, re.M)]
    assert blocks and all(len(line) <= 100 for b in blocks for line in b.strip().splitlines()), blocks[:1]
    assert "trials ended" not in run.stdout, "progress is on stderr"
    assert "| Trial name" not in run.stdout + run.stderr, "Ray's per-trial table is for --verbose"
    # The answer: printed as a table that fits the terminal (COLUMNS=100: no line of the search's output is
    # wider, Ray's included), and logged as ranking.csv: every loss ranked on 3 or 5 confirmation seeds (the
    # race); none judged on fewer epochs than another.
    wide = [line for line in (run.stdout + run.stderr).splitlines() if len(line) > 100]
    assert not wide, wide[:5]
    table = run.stdout[run.stdout.index("digits: which loss wins"):]
    assert "Holm, family-wise 2.5%, margin ±0.5 points" in " ".join(table.split())  # the key wraps at 100
    assert "Best set on validation " in table and "Compute: " in table
    assert "Noise: moderated (docs/verdicts.md, section 12)" in " ".join(table.split()), \
        "the default noise model"
    # where to see it: the MLflow UI's runs table, in the search's saved view (MLflow 3.17 opens the GenAI
    # view without the page's address)
    assert "MLflow UI: mlflow ui --backend-store-uri sqlite:///mlflow.db\n  then open " \
           "http://127.0.0.1:5000/#/experiments/1/runs?viewStateShareKey=digits-" in table, table[-600:]
    # what it would take to decide the undecided, and how to ask for it (this race cannot take more seeds)
    assert re.search(r"What would decide the undecided .*a new search with --race --max-seeds \d+ "
                     r"asks for them", " ".join(table.split())), table[-3000:]
    from mlflow import MlflowClient
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = client.search_runs([client.get_experiment_by_name("digits").experiment_id],
                                   "tags.`tune_as.role` = 'search'")
    assert f"viewStateShareKey={parent.data.tags['tune_as.search_id']}\n" in table  # its view
    logged = Path(client.download_artifacts(parent.info.run_id, "ranking.csv", str(tmp_path))).read_text()
    rows = {cells[1]: cells for cells in csv.reader(logged.splitlines()[1:])
            if re.fullmatch(r"\d+=?", cells[0])}
    # each row of the answer is in the printed table, its loss first on a line
    for loss, cells in rows.items():
        assert re.search(rf"^ {re.escape(cells[0])} +{loss} ", table, re.MULTILINE), (loss, table)
    from tune_as.losses import LOSSES
    assert set(rows) == {name for name, cls in LOSSES.items() if "multiclass" in cls.kinds}
    # every trial completes its epochs; a loss with nothing to tune has one search trial (confirmation brings
    # seeds)
    assert all(cells[3] in ("2 (2)", "1 (1)") for cells in rows.values()), rows
    assert rows["softmax"][3] == "1 (1)" and rows["as_softmax"][3] == "2 (2)"
    assert all(cells[5].count("±") == 1 for cells in rows.values()), "test mean ± std over the seeds"
    words = ("win", "loss", "equivalent", "undecided (3 seeds)", "undecided (5 seeds)")
    assert all(unmarked(cells[7]) in words for loss, cells in rows.items() if loss != "softmax"), rows
    assert rows["softmax"][7] == "baseline"
    confirmations = client.search_runs([client.get_experiment_by_name("digits").experiment_id],
                                       "tags.`tune_as.role` = 'confirmation'", max_results=500)
    per_loss = {loss: sum(r.data.tags["tune_as.loss"] == loss for r in confirmations) for loss in rows}
    assert set(per_loss.values()) <= {3, 5} and per_loss["softmax"] == max(per_loss.values()), per_loss
    report_argv = next(a for a in _commands("tune_as.report") if "--confirm" not in a)
    run = subprocess.run([sys.executable, "-m", "tune_as.report", *report_argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "report").is_dir() and any((tmp_path / "report").glob("*.md"))
    # the report prints the search's own answer, replayed from its runs: the same table, byte for byte
    (answer,) = (tmp_path / "report").glob("answer_*.csv")
    assert answer.read_text() == logged
    # any finished search's answer, printed again from its record for a script: JSON, numbers as numbers, the
    # same verdicts and differences as the table it logged
    run = subprocess.run([sys.executable, "-m", "tune_as.report", "--experiment", "digits", "--print",
                          "json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    by_loss = {row["loss"]: row for row in doc["losses"]}
    assert set(by_loss) == set(rows) and doc["baseline"] == "softmax" and doc["margin_points"] == 0.5
    for loss, cells in rows.items():
        row = by_loss[loss]
        assert row["rank"] == int(cells[0].rstrip("=")) and len(row["test_points"]["values"]) == row["seeds"]
        if loss != "softmax":
            assert row["verdict"] == unmarked(cells[7]).split(" (")[0], (row, cells)
            assert f"{row['diff_points']:+.2f}" == cells[6].split()[0], (row, cells)
