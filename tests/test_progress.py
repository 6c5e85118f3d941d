"""The progress view: one line per loss in at most 100 columns, whatever the number of losses and parameters."""

from __future__ import annotations

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
