"""The progress view: one line per loss in at most 100 columns, whatever the number of losses and
parameters."""

from __future__ import annotations

import pytest

from tune_as.engine.progress import WIDTH, TrialStatus, loss_lines


def test_one_line_per_loss_counts_and_the_best_setting_within_100_columns() -> None:
    long_setting = ", ".join(f"param_{i}=0.{i}23456789012345" for i in range(12))
    trials = [
        TrialStatus("softmax", "TERMINATED", 10.0, 10.0, 0.9826, ""),
        TrialStatus("as_softmax", "TERMINATED", 3.0, 10.0, 0.95, "delta=0.1, warmup_r=0.0"),  # stopped early
        TrialStatus("as_softmax", "RUNNING", 4.0, 10.0, 0.9931, "delta=0.1422778826073568, warmup_r=0.05"),
        TrialStatus("multilabel_sparse_softmax_with_a_long_name", "ERROR", 1.0, 10.0, None, long_setting),
        TrialStatus("sm_taylor_softmax", "TERMINATED", 10.0, 10.0, 0.97, long_setting),
        TrialStatus("t_softmax", "PENDING", 0.0, 10.0, None, "tau=1.0"),
        TrialStatus("bce_diverged", "TERMINATED", 0.3, 10.0, None, "", error=True),
    ]
    lines = loss_lines(trials, "digits search", "accuracy")
    assert all(len(line) <= WIDTH for line in lines), [len(line) for line in lines]
    assert lines[0] == "digits search: 5/7 trials ended, 1 running"
    assert loss_lines(trials[:2], "s", "accuracy", total=9)[0] == "s: 2/9 trials ended, 0 running"
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert len(lines) == 2 + 6, "one line per loss"
    assert rows["bce_diverged"][1:6] == ["0", "0", "0", "1", "-"], "a diverged trial is a failure, not a stop"
    assert rows["as_softmax"][1:6] == ["0", "1", "1", "0", "99.31"], "done, running, stopped, failed, best"
    assert "delta=0.1422778826073568" in lines[3], "the best value's setting, as logged (not rounded)"
    assert rows["softmax"][1:6] == ["1", "0", "0", "0", "98.26"]
    assert rows["t_softmax"][1:6] == ["0", "0", "0", "0", "-"]
    assert any(line.endswith("…") for line in lines), "a setting too long for the line is cut, visibly"


def test_the_header_says_time_elapsed_and_left_from_the_epochs_trained_so_far() -> None:
    from tune_as.engine.progress import clock, time_left

    # 4 trials of 10 epochs planned: one done (10), one stopped early at 3 (nothing left), one at 2 of 10,
    # one not created yet (mean planned epochs: 10): 15 epochs in 30 s -> 0.5 epoch/s, 8 + 10 left -> 36 s
    trials = [TrialStatus("a", "TERMINATED", 10.0, 10.0, 0.9, ""),
              TrialStatus("a", "TERMINATED", 3.0, 10.0, 0.5, ""),
              TrialStatus("b", "RUNNING", 2.0, 10.0, 0.4, "")]
    assert time_left(trials, 4, 30.0) == pytest.approx(36.0)
    # nothing trained yet
    assert time_left([TrialStatus("a", "PENDING", 0.0, 10.0, None, "")], 4, 30.0) is None
    assert (clock(65), clock(3725)) == ("1:05", "1:02:05")
    header = loss_lines(trials, "digits search", "accuracy", total=4, elapsed_s=30.0)[0]
    assert header == "digits search: 2/4 trials ended, 1 running; 0:30 elapsed, about 0:36 left"


def test_in_a_pipe_a_block_is_appended_only_when_more_than_the_clock_changed(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tune_as.engine import progress

    class Stub:  # the two attributes of a Tune trial the view reads
        def __init__(self, status: str, epoch: float) -> None:
            self.status, self.config, self.last_result = \
                status, {"loss": "softmax", "epochs": 2.0}, {"epoch": epoch}

    view = progress.LossProgress("digits search", "accuracy", {}, every_s=0.0)
    view.tty = False
    view.report([Stub("RUNNING", 1.0)], done=False)
    view.report([Stub("RUNNING", 1.0)], done=False)  # only the clock moved: nothing appended
    view.report([Stub("TERMINATED", 2.0)], done=True)
    blocks = [b for b in capsys.readouterr().out.split("\n\n") if b.strip()]
    assert len(blocks) == 2 and "1 running" in blocks[0] and "1/1 trials ended" in blocks[1]


def test_encoding_progress_in_a_pipe_counts_documents_with_rate_and_time_left(capsys) -> None:
    """Without a terminal (a log, CI), the long waits of data preparation print a line at most every 30 s of
    their clock and one at the end: documents done of all, documents per second, time left."""
    from tune_as.tasks.featurize import track

    ticks = iter(range(0, 10_000, 20))  # a clock that moves 20 s per reading: no sleeping, no machine speed
    batches = [list(range(100))] * 9 + [list(range(40))]
    seen = list(track(batches, "eurlex: encoding test (minilm)", [len(b) for b in batches],
                      clock=lambda: float(next(ticks))))
    assert seen == batches
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "eurlex: encoding test (minilm): 200/940 docs, 5 docs/s, 2 min 28 s left"
    assert lines[-1] == "eurlex: encoding test (minilm): 940 docs in 3 min 40 s"
    assert len(lines) == 5 and all(len(line) <= 100 for line in lines)


def test_the_first_line_says_what_will_run_before_the_slow_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Printed by the CLI right after the arguments are checked (importing PyTorch, Ray Tune and MLflow and
    starting Ray take seconds before the search's own lines); never the text of --address (it may hold a
    password). Wrapped to the terminal's width ($COLUMNS first): pinned to 100 here, as the test's wording
    expects (under pytest-xdist the width here was 80 and the first line wrapped before 'loss;')."""
    monkeypatch.setenv("COLUMNS", "100")
    from tune_as.engine.request import SearchRequest
    from tune_as.search import starting_line

    race = starting_line(SearchRequest(task="digits", losses=("softmax", "as_softmax"), race=True,
                                       max_seeds=5))
    assert race.startswith("digits: a search of losses softmax, as_softmax, then racing up to 5 seeds "
                           "per loss;")
    assert "starting a local Ray" in race and all(len(line) <= 100 for line in race.splitlines())
    joined = starting_line(SearchRequest(task="sst5", confirm=3, address="u:pw@host:6379"))
    assert "then 3 seeds per loss" in joined and "pw" not in joined and "--address" in joined
    assert starting_line(SearchRequest(task="", resume=True, name="digits-1")).startswith(
        "resuming digits-1;")


def test_a_population_shows_its_best_member_so_far() -> None:
    """A population's result holds each member's report under its prefix (engine.members.flat_report): the
    progress line shows the best member's value, as a loss's solo trials show theirs (before: '-')."""
    from tune_as.engine.members import POPULATION, flat_report
    from tune_as.engine.progress import best_of

    last = flat_report({1: {"epoch": 1.0, "best_val_accuracy": 0.91},
                        2: {"epoch": 1.0, "best_val_accuracy": 0.93},
                        3: {"epoch": 1.0}}, {1, 2, 3}, 3)
    assert best_of({POPULATION: [1, 2, 3]}, last, "accuracy") == 0.93
    assert best_of({}, {"best_val_accuracy": 0.5}, "accuracy") == 0.5
    assert best_of({POPULATION: [1]}, {"epoch": 0.0}, "accuracy") is None
