"""The progress view: one view for the whole run on stderr, every line cut to the terminal's width, redrawn
in place in a terminal (one block per phase in the scrollback), a line per change elsewhere, and a time left
that holds back until it has data. The view is tested on a fake clock and a fake terminal: no sleeping, no
machine speed, no Ray."""

from __future__ import annotations

import io
import pickle
import re

import pytest

from tune_as.engine.progress import (
    LossProgress,
    RunView,
    TrialStatus,
    loss_lines,
    round_bounds,
    run_line,
)
from tune_as.results.racing import Plan

WIDTHS = (60, 80, 100, 160, 200)


def test_one_line_per_loss_counts_and_the_best_setting_cut_to_the_width() -> None:
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
    for width in WIDTHS:
        lines = loss_lines(trials, "accuracy", width)
        assert all(len(line) <= width for line in lines), (width, [len(line) for line in lines])
        assert any(line.endswith("…") for line in lines), "a setting too long for the line is cut, visibly"
    lines = loss_lines(trials, "accuracy", 100)
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert len(lines) == 1 + 6, "one line per loss"
    assert rows["bce_diverged"][1:6] == ["0", "0", "0", "1", "-"], "a diverged trial is a failure, not a stop"
    assert rows["as_softmax"][1:6] == ["0", "1", "1", "0", "99.31"], "done, running, stopped, failed, best"
    assert "delta=0.1422778826073568" in lines[2], "the best value's setting, as logged (not rounded)"
    assert rows["softmax"][1:6] == ["1", "0", "0", "0", "98.26"]
    assert rows["t_softmax"][1:6] == ["0", "0", "0", "0", "-"]


def test_the_run_line_fits_every_width_leaving_out_its_last_parts_first() -> None:
    """The bar takes the room the words leave it; a narrow terminal keeps the share done and the time left
    (the parts a person looks for) and drops the bar, then the trial-epochs, then the time elapsed."""
    for width in range(20, 201):
        line = run_line("digits", 150, 440, 62, 125, width)
        assert len(line) <= width and line.startswith("digits  34%"), (width, line)
    assert run_line("digits", 150, 440, 62, 125, 100) == \
        "digits  34% [###########.....................] about 2:05 left · 1:02 elapsed · 150/440 trial-epochs"
    assert run_line("digits", 150, 440, 62, 125, 60) == \
        "digits  34% [#####..........] about 2:05 left · 1:02 elapsed"
    assert "about 2:05 left" in run_line("digits", 150, 440, 62, 125, 40)
    assert "time left after the first trial-epochs" in run_line("digits", 0, 440, 3, None, 100)
    assert "done" in run_line("digits", 440, 440, 300, 0.0, 100)


def view_on(stream: io.StringIO, now: list[float], width: int = 100, height: int = 40,
            every_s: float = 0.0) -> RunView:
    return RunView("digits", "accuracy", stream=stream, clock=lambda: now[0], size=lambda: (width, height),
                   every_s=every_s)


def test_the_run_counts_the_search_s_plan_and_every_possible_round_corrected_as_trials_stop() -> None:
    """One bar over the whole run: each loss's trials x their epochs (trials not created yet included), then
    every confirmation round the race may run, at most the budget; a trial ASHA stops early gives back the
    epochs it did not train, a round the race no longer needs drops out."""
    now = [0.0]
    view = view_on(io.StringIO(), now)
    view.expect({"softmax": (1, 5.0), "as_softmax": (2, 5.0)}, round_bounds((3, 5), 2, 5.0))
    assert view.total() == 15 + 30 + 20
    view.begin("search")
    view.update({"a": TrialStatus("as_softmax", "RUNNING", 2.0, 5.0, 0.5, "")})
    assert (view.done(), view.total()) == (2.0, 65.0), "a running trial counts its planned epochs"
    view.update({"a": TrialStatus("as_softmax", "TERMINATED", 2.0, 5.0, 0.5, "")})
    assert view.total() == 62.0, "stopped early at 2 of 5 epochs: 3 fewer"
    view.begin("confirmation round 1 of at most 2", {"softmax": (3, 5.0), "as_softmax": (3, 5.0)})
    view.rounds_left([10.0])  # the race knows better now: round 2 at most 10
    assert view.total() == 15 - 3 + 30 + 10
    view.rounds_left([])
    assert view.total() == 42.0, "the race is over: no round after this one"
    capped = view_on(io.StringIO(), now)
    capped.expect({"softmax": (1, 5.0)}, [30.0, 20.0], cap=40.0)
    assert capped.total() == 40.0, "never more than --budget"
    # the race's own plan: 3 seeds, then 2 more, for every loss
    race = Plan(("softmax", "t_softmax"), "softmax", range(10), max_seeds=5)
    assert round_bounds(race.looks, 2, 4.0) == [24.0, 16.0]
    assert round_bounds((3, 5, 7), 4, 1.0, after=1) == [8.0, 8.0]


class Run:
    """A run on a fake clock, as Tune's loop shows it to the reporter: trials of a phase created as
    `concurrency` slots free up, each epoch `epoch_s` seconds, a start-up of `startup_s` before the phase's
    first epoch (Ray starting workers, loading the data), the view sampled every second."""

    def __init__(self, view: RunView, now: list[float], concurrency: int = 2, epoch_s: float = 2.0) -> None:
        self.view, self.now, self.concurrency, self.epoch_s = view, now, concurrency, epoch_s
        self.estimates: list[tuple[float, float | None]] = []  # (time, time left shown)

    def phase(self, name: str, expected: dict[str, tuple[int, float]] | None,
              trials: list[tuple[str, float, float]], startup_s: float) -> None:
        """`trials`: (loss, epochs, epochs it trains before it ends: fewer when ASHA stops it)."""
        self.view.begin(name, expected)
        todo, running, shown = list(enumerate(trials)), {}, {}
        ready, step = self.now[0] + startup_s, 0.25
        while todo or running:
            while todo and len(running) < self.concurrency:
                i, (loss, epochs, stop) = todo.pop(0)
                running[i] = [loss, epochs, stop, 0.0]
            for i, trial in list(running.items()):
                if self.now[0] >= ready:
                    trial[3] += step / self.epoch_s
                loss, epochs, stop, progress = trial
                ended = progress >= stop - 1e-9
                shown[f"{name}-{i}"] = TrialStatus(loss, "TERMINATED" if ended else "RUNNING",
                                                   min(float(int(progress + 1e-9)), stop), epochs, 0.9, "")
                if ended:
                    del running[i]
            self.now[0] += step
            if self.view.should_update(False):
                self.view.update(shown)
                self.estimates.append((self.now[0], self.view.left()))
        self.view.update(shown, done=True)


def a_digits_race(view: RunView, now: list[float]) -> Run:
    """The shape of `--task digits --trials-per-loss 2 --max-epochs 5 --race --max-seeds 5`: 13 losses (3
    with nothing to tune: one trial), ASHA stopping 6 trials at epoch 2, round 1 with 3 seeds for every
    loss, round 2 with 2 more for the 10 losses still undecided."""
    losses = [f"loss{i}" for i in range(13)]
    search = {loss: (1 if i < 3 else 2, 5.0) for i, loss in enumerate(losses)}
    view.expect(search, round_bounds((3, 5), 13, 5.0))
    run = Run(view, now)
    trials = [(loss, 5.0, 2.0 if n == 1 and i % 2 else 5.0)
              for i, loss in enumerate(losses) for n in range(search[loss][0])]
    run.phase("search", None, trials, startup_s=15.0)
    view.rounds_left(round_bounds((3, 5), 13, 5.0, after=1))
    run.phase("confirmation round 1 of at most 2", {loss: (3, 5.0) for loss in losses},
              [(loss, 5.0, 5.0) for loss in losses for _ in range(3)], startup_s=4.0)
    view.rounds_left([])
    run.phase("confirmation round 2 of 2", {loss: (2, 5.0) for loss in losses[:10]},
              [(loss, 5.0, 5.0) for loss in losses[:10] for _ in range(2)], startup_s=4.0)
    return run


def test_the_time_left_waits_for_data_then_is_within_2x_of_the_true_end_from_a_quarter_of_the_run() -> None:
    """The run's time left covers every phase (before: one phase's, '0:00 left' as the search ended with most
    of the run to come); none is shown before a trial-epoch is trained past the first one, and the start-up
    before the first is not counted as work (before, the first estimates were 10-69x too high): every
    estimate shown, the first included, is within 2x of the time really left, until the last epoch (the
    reports' grain)."""
    now = [0.0]
    run = a_digits_race(view_on(io.StringIO(), now), now)
    end = now[0]
    first = next(t for t, left in run.estimates if left is not None)
    assert all(left is None for t, left in run.estimates if t < first) and 15.0 < first < 20.0
    shown = [(t, left / (end - t)) for t, left in run.estimates
             if left is not None and end - t >= run.epoch_s]
    assert all(0.5 <= ratio <= 2.0 for _, ratio in shown), [(t, round(r, 2)) for t, r in shown
                                                            if not 0.5 <= r <= 2.0][:5]
    assert all(left is not None for t, left in run.estimates if t >= end / 4 and end - t >= run.epoch_s)


class Terminal:
    """A terminal, as far as the view uses one: it wraps at `width` (the cursor waits in the last column until
    the next character), reflows its lines when resized, moves up at most to the top of its `height` rows
    (what scrolled above is scrollback) on CPL (ESC [ n F) and clears below on ED (ESC [ J)."""

    def __init__(self, width: int, height: int = 40) -> None:
        self.width, self.height = width, height
        self.rows: list[tuple[str, bool]] = []  # (text, continues on the next row)
        self.line, self.escapes = "", 0

    def isatty(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def write(self, text: str) -> None:
        for token in re.split(r"(\x1b\[\d*[A-Za-z])", text):
            if token.startswith("\x1b["):
                self.escapes += 1
                if token.endswith("F"):
                    top = max(0, len(self.rows) - (self.height - 1))  # the screen's first row
                    self.up = max(top, len(self.rows) - int(token[2:-1]))
                else:
                    assert token == "\x1b[J", token
                    self.rows, self.line = self.rows[: self.up], ""
                continue
            for char in token:
                if char == "\n":
                    self.rows.append((self.line, False))
                    self.line = ""
                    continue
                if len(self.line) == self.width:
                    self.rows.append((self.line, True))
                    self.line = ""
                self.line += char

    def resize(self, width: int) -> None:
        lines, joined = [], ""
        for text, more in self.rows:
            joined += text
            if not more:
                lines.append(joined)
                joined = ""
        self.width, self.rows = width, []
        for line in lines:
            parts = [line[i:i + width] for i in range(0, len(line), width)] or [""]
            self.rows += [(part, i < len(parts) - 1) for i, part in enumerate(parts)]

    def text(self) -> list[str]:
        return [text for text, _ in self.rows]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("height", [40, 12])
def test_in_a_terminal_each_phase_leaves_one_block_whatever_the_width_and_a_resize(width: int,
                                                                                   height: int) -> None:
    """Redrawn in place at 60-200 columns, on a screen shorter than the block too, and resized in the middle
    of the search (narrower: the terminal shows the block on more rows; wider): when the run ends the
    scrollback holds one block per phase, every line within the width it was drawn at (before: at 80 columns
    the lines wrapped, the redraw went up too few rows and 86 blocks piled up)."""
    now, term = [0.0], Terminal(width, height)
    view = RunView("digits", "accuracy", stream=term, clock=lambda: now[0],  # type: ignore[arg-type]
                   size=lambda: (term.width, term.height))
    losses = [f"loss_{i}_" + "x" * (i % 9) for i in range(13)]
    view.expect({loss: (2, 5.0) for loss in losses}, [195.0, 130.0])
    view.begin("search")
    setting = ", ".join(f"p{i}=0.{i}123456789" for i in range(8))
    for step in range(60):
        now[0] += 1.0
        if step == 30:
            term.resize(max(60, width // 2) if width > 60 else 130)
        view.update({f"t{i}": TrialStatus(loss, "RUNNING" if step < 59 else "TERMINATED",
                                          min(5.0, step / 10), 5.0, 0.9 + step / 1000, setting)
                     for i, loss in enumerate(losses)}, done=step == 59)
        assert all(len(row) <= term.width for row in term.text())
    for round_no in (1, 2):
        view.note(f"Confirmation round {round_no}: 39 runs of 13 losses, no early stopping (seeds 1, 2, 3)")
        view.begin(f"confirmation round {round_no} of at most 2", {loss: (3, 5.0) for loss in losses})
        for step in range(20):
            now[0] += 1.0
            view.update({f"r{i}": TrialStatus(loss, "RUNNING", step / 4, 5.0, 0.9, setting)
                         for i, loss in enumerate(losses)}, done=step == 19)
    shown = term.text()
    assert sum(row.startswith("search: ") for row in shown) == 1, "\n".join(shown)
    assert [sum(row.startswith(f"confirmation round {k} ") for row in shown) for k in (1, 2)] == [1, 1]
    assert sum(row.startswith("loss ") for row in shown) == 3 and sum(row.startswith("digits ") for row in
                                                                     shown) == 3
    assert term.escapes > 0 and all(len(row) <= term.width for row in shown)


def test_elsewhere_a_line_only_when_something_changed_and_the_block_as_its_phase_ends() -> None:
    """In a pipe or a log: no escape sequence, a line when a phase's counts change (the clock moving is no
    change), at most every `every_s`, and each phase's block once."""
    now, out = [0.0], io.StringIO()
    view = view_on(out, now, every_s=10.0)
    view.expect({"softmax": (2, 2.0)})
    view.begin("search")
    running = {"a": TrialStatus("softmax", "RUNNING", 0.0, 2.0, None, "")}
    for _ in range(4):  # the same counts: one line
        now[0] += 1.0
        view.update(running)
    view.update({"a": TrialStatus("softmax", "TERMINATED", 2.0, 2.0, 0.9, "")})  # within 10 s of the last
    now[0] += 10.0
    view.update({"a": TrialStatus("softmax", "TERMINATED", 2.0, 2.0, 0.9, ""),
                 "b": TrialStatus("softmax", "RUNNING", 1.0, 2.0, 0.8, "")})
    view.update({"a": TrialStatus("softmax", "TERMINATED", 2.0, 2.0, 0.9, ""),
                 "b": TrialStatus("softmax", "TERMINATED", 2.0, 2.0, 0.8, "")}, done=True)
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()
    assert lines[0].startswith("digits   0% [") and lines[1] == "search: 0/2 trials ended, 1 running"
    assert lines[2].startswith("digits  75% [") and lines[3] == "search: 1/2 trials ended, 1 running", lines
    assert lines[4].startswith("digits 100% [") and lines[5] == "search: 2/2 trials ended, 0 running"
    assert len(lines) == 2 + 2 + 4 + 1 and lines[-1] == "", "two changes, the block (4 lines), a blank line"


def test_progress_goes_to_stderr_and_tune_s_reporter_finds_its_view_after_a_pickle(
        capsys: pytest.CaptureFixture[str]) -> None:
    """stdout holds the answer alone (`--format json | jq`); Ray pickles the reporter with the experiment
    and a resumed search's driver unpickles it, so it finds the view by its search's id (one pickled before
    views had ids: the view registered last)."""

    class Trial:  # what the reporter reads of a Tune trial
        def __init__(self, trial_id: str, status: str, epoch: float) -> None:
            self.trial_id, self.status = trial_id, status
            self.config = {"loss": "t_softmax", "epochs": 2.0, "loss.tau": 0.673273390}
            self.last_result = {"epoch": epoch, "best_val_accuracy": 0.91}

    view = RunView("digits", "accuracy", {"t_softmax": ("loss.tau",)}, every_s=0.0).register("digits-1")
    view.expect({"t_softmax": (1, 2.0)})
    view.begin("search")
    reporter = pickle.loads(pickle.dumps(LossProgress("digits-1")))
    assert reporter.should_report([], done=True)
    reporter.report([Trial("x_00000", "TERMINATED", 2.0)], True)
    out, err = capsys.readouterr()
    assert out == "" and "search: 1/1 trials ended" in err and "t_softmax" in err and "tau=0.6733" in err
    old = LossProgress.__new__(LossProgress)
    old.__dict__.update({"title": "digits search", "metric": "accuracy"})  # a reporter pickled before
    assert old.view is RunView.registered(None)


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


@pytest.mark.parametrize("width", [60, 80])
def test_the_lines_that_end_a_search_fit_the_terminal(width: int) -> None:
    """What a search prints after its answer (what it cost, where its runs are) wraps to the terminal's
    width (at 80 columns both ran past the pane); an address wider than the pane stays whole, on a line of
    its own."""
    from tune_as.engine.record import Compute
    from tune_as.results.render import fit
    from tune_as.tracking.schema import ui_line

    url = "http://127.0.0.1:5000/#/experiments/1/runs?viewStateShareKey=digits-20261207-173823"
    tail = fit(Compute(115, 325, 23, 65, 163.0).line() + "\n"
               + ui_line("sqlite:///mlflow.db", "1", "digits-20261207-173823"), width)
    assert all(len(line) <= width or line.strip() == url for line in tail.splitlines()), tail
    assert url in tail.splitlines()[-1]
