"""Populations in Tune (tune_as.engine.members), without Ray: the grouping of confirmation seeds into trials
and the fan-out back into one run per member."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tune_as.engine.members import POPULATION, flat_report, grid_epochs, members, population_problem
from tune_as.settings import TrialSettings


def settings(loss: str, seed: int, **over: Any) -> TrialSettings:
    return TrialSettings(loss=loss, epochs=2.0, batch_size=32, lr=1e-3, seed=seed, **over)


def test_seeds_of_one_setting_group_into_populations_of_at_most_n_in_order() -> None:
    from tune_as.engine.members import group

    configs = [settings("softmax", s) for s in (5, 6, 7, 8, 9)] + [settings("as_softmax", s) for s in (5, 6)]
    grouped, notes = group(configs, 2, lambda c: None)
    assert [(c["loss"], c["seed"], c.get(POPULATION)) for c in grouped] == [
        ("softmax", 5, [5, 6]), ("softmax", 7, [7, 8]), ("softmax", 9, None), ("as_softmax", 5, [5, 6])]
    assert notes == []
    # one seed per trial: today's configs, unchanged
    assert group(configs, 1, lambda c: "never asked") == ([c.to_dict() for c in configs], [])


def test_a_setting_that_cannot_be_a_population_keeps_one_trial_per_seed_and_says_why() -> None:
    from tune_as.engine.members import group

    configs = [settings("as_softmax", s, skip_masked_rows=True) for s in (5, 6)] + [settings("softmax", 5),
                                                                                   settings("softmax", 6)]
    grouped, notes = group(configs, 4, lambda c: "row skipping" if c.skip_masked_rows else None)
    assert [c.get(POPULATION) for c in grouped] == [None, None, [5, 6]]
    assert notes == ["as_softmax: one trial per seed (row skipping)."]


def test_a_population_result_fans_out_into_one_run_per_member_with_its_seed() -> None:
    config = {**settings("softmax", 5).to_dict(), POPULATION: [5, 6]}
    latest = {5: {"val_accuracy": 0.8, "epoch": 2.0}, 6: {"error": "non-finite training loss", "epoch": 1.0}}
    result = {**flat_report(latest, {5}, 2), "training_iteration": 2, "node_id": "n1"}
    assert result["epoch"] == 2.0 and result["members"] == 2
    runs = members("t1", config, result)
    assert [(m.run_id, m.config["seed"], m.fresh) for m in runs] == \
        [("t1-seed5", 5, True), ("t1-seed6", 6, False)]
    assert runs[0].metrics == {"val_accuracy": 0.8, "epoch": 2.0, "training_iteration": 2, "node_id": "n1"}
    assert runs[1].metrics["error"] == "non-finite training loss"
    assert all(POPULATION not in m.config for m in runs)
    TrialSettings.from_dict(runs[0].config)  # a solo trial's config again
    grid = [SimpleNamespace(metrics=result, config=config, path="softmax_0001")]  # what a Tune grid holds
    assert grid_epochs(grid) == 3.0
    # a solo trial is a population of one: its own id, config and result
    solo = settings("softmax", 5).to_dict()
    assert members("t2", solo, {"epoch": 1.0}) == [("t2", solo, {"epoch": 1.0}, True)]


def test_the_data_decides_whether_a_population_can_train() -> None:
    from test_population import frozen

    data, _ = frozen("multiclass")
    assert population_problem(data, settings("softmax", 1)) is None
    assert "fp16" in str(population_problem(data, settings("softmax", 1, precision="fp16")))
    data.model_info["encoder"] = "finetune"
    assert "frozen-feature heads" in str(population_problem(data, settings("softmax", 1)))


def test_missing_names_the_configs_no_trial_ran_whatever_the_round_trip_of_their_values() -> None:
    """A resumed round's trials (their configs back from Ray's JSON state: tuples as lists, keys in any order)
    against the round's configs: only those without a trial are missing, in the round's order."""
    import json

    from tune_as.engine.members import group, missing

    grouped, _ = group([settings("softmax", s) for s in (5, 6, 7)]
                       + [settings("as_softmax", s) for s in (5, 6)],
                       2, lambda c: None)
    # as Ray gives them back
    back = [dict(reversed(list(json.loads(json.dumps(c)).items()))) for c in grouped]
    assert missing(grouped, back) == []
    assert missing(grouped, [back[0], back[2]]) == [grouped[1]]
    assert missing(grouped, []) == grouped
    assert missing(grouped, [{**back[0], "lr": 2e-3}]) == grouped  # another setting is not the same run
