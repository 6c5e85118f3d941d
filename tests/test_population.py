"""A population's member i is the run a solo trial of seed i makes: every loss, AS-Softmax's masked cycles and
AS-Speed's per-member accumulation included; members fail alone; what cannot be a population is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tune_as.losses import LOSSES
from tune_as.settings import DataSettings
from tune_as.tasks import PreparedData, Split, build_task
from tune_as.training.population import Population, run_population
from tune_as.training.trial import run_trial

SEEDS = (3, 11, 12)
DIM, CLASSES = 12, 6
# the values that make the rules under test happen: masked rows (delta), accumulation (lam), real margins
PARAMS: dict[str, dict[str, Any]] = {
    "as_softmax": {"delta": 0.1}, "as_speed": {"delta": 0.1, "lam": 1.5, "max_steps": 3},
    "multilabel_as_softmax": {"delta": 0.1}, "sparse_softmax": {"k": 3},
    "multilabel_sparse_softmax": {"k": 3},
}
# metrics compared exactly (counts and schedules) and to float rounding (everything measured)
EXACT = ("optimizer_steps", "samples_seen", "accum_steps", "backward_rows", "epoch")
SKIP = ("train_seconds", "eval_seconds")


def frozen(kind: str, n: tuple[int, int, int] = (90, 30, 30), seed: int = 0) -> tuple[PreparedData, Any]:
    """A frozen-feature task of `kind` (sentence features of DIM, CLASSES labels) whose classes are
    learnable."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, DIM, generator=g) * 1.5

    def split(rows: int) -> Split:
        y = torch.randint(0, CLASSES, (rows,), generator=g)
        x = (centers[y] + torch.randn(rows, DIM, generator=g)).half()
        if kind == "multilabel":
            extra = torch.randint(0, CLASSES, (rows,), generator=g)
            hot = torch.zeros(rows, CLASSES)
            hot[torch.arange(rows), y] = 1.0
            hot[torch.arange(rows), extra] = 1.0
            return Split({"features": x, "labels": hot})
        return Split({"features": x, "labels": y})

    name = "goemotions" if kind == "multilabel" else "clinc_oos"
    names = tuple(f"c{i}" for i in range(CLASSES))
    data = PreparedData(name, kind, DataSettings(name, backbone="minilm", encoder="frozen"), split(n[0]),
                        split(n[1]), split(n[2]), names, {"encoder": "frozen", "feature_dim": DIM})
    for s in (data.train, data.validation, data.test):
        s.label_names = names
    return data, build_task(name)


class Solo:
    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def wants_checkpoint(self, final: bool) -> bool:
        return False

    def report(self, metrics: dict[str, Any], checkpoint_dir: Path | None) -> None:
        self.reports.append(metrics)


class Members:
    def __init__(self, size: int) -> None:
        self.reports: list[list[dict[str, Any]]] = [[] for _ in range(size)]
        self.finals: list[bool] = []
        self.margins: list[Any] = []

    def report(self, reports: dict[int, dict[str, Any]], final: bool, margins: Any = ()) -> None:
        for member, metrics in reports.items():
            self.reports[member].append(metrics)
        self.finals.append(final)
        self.margins = list(margins)


def config(loss: str, **over: Any) -> dict[str, Any]:
    params = {f"loss.{k}": v for k, v in PARAMS.get(loss, {}).items()}
    return {"loss": loss, "epochs": 3.0, "batch_size": 16, "lr": 3e-3, "precision": "fp32", **params, **over}


def assert_same_run(solo: list[dict[str, Any]], member: list[dict[str, Any]], where: str) -> None:
    assert len(solo) == len(member), where
    for k, (a, b) in enumerate(zip(solo, member, strict=True)):
        assert sorted(a) == sorted(b), (where, k)
        for key, va in a.items():
            if key in SKIP:
                continue
            vb = b[key]
            if key in EXACT:
                assert va == vb, (where, k, key, va, vb)
            else:
                assert math.isclose(va, vb, rel_tol=2e-4, abs_tol=2e-5), (where, k, key, va, vb)


def single_label(name: str) -> bool:
    return "multiclass" in LOSSES[name].kinds


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_each_member_is_the_solo_trial_of_its_seed(loss: str) -> None:
    kind = "multiclass" if single_label(loss) else "multilabel"
    data, task = frozen(kind)
    cfg = config(loss, warmup_r=0.2 if LOSSES[loss].supports_warmup else 0.0)
    members = Members(len(SEEDS))
    run_population(cfg, SEEDS, data, task, members)
    for i, seed in enumerate(SEEDS):
        solo = Solo()
        run_trial({**cfg, "seed": seed}, data, task, solo)
        assert_same_run(solo.reports, members.reports[i], f"{loss} seed {seed}")


@pytest.mark.parametrize("loss", ["softmax", "as_speed"])
def test_a_population_of_one_is_its_solo_trial(loss: str) -> None:
    """P = 1 (bench_population's first size; a round with one seed left of a loss): the same run as a solo
    trial."""
    data, task = frozen("multiclass")
    cfg = config(loss)
    members = Members(1)
    run_population(cfg, SEEDS[:1], data, task, members)
    solo = Solo()
    run_trial({**cfg, "seed": SEEDS[0]}, data, task, solo)
    assert_same_run(solo.reports, members.reports[0], f"{loss} alone")


@pytest.mark.parametrize("every", [None, 2])
def test_as_speed_members_accumulate_on_their_own_schedules_as_their_solo_trials(every: int | None) -> None:
    """The per-member rule is exercised: the members end with different optimizer step counts (their cycles
    differ), and each one's reports (every epoch, or every 2 of its own optimizer steps) are its solo
    trial's."""
    data, task = frozen("multiclass", n=(320, 30, 30))
    cfg = config("as_speed", epochs=4.0, eval_every_steps=every, **{"loss.lam": 1.0})
    members = Members(len(SEEDS))
    run_population(cfg, SEEDS, data, task, members)
    assert len({r[-1]["optimizer_steps"] for r in members.reports}) > 1
    assert all(r[-1]["masked_ratio"] > 0 for r in members.reports)
    for i, seed in enumerate(SEEDS):
        solo = Solo()
        run_trial({**cfg, "seed": seed}, data, task, solo)
        assert_same_run(solo.reports, members.reports[i], f"seed {seed}")


def test_a_diverging_member_fails_alone() -> None:
    data, task = frozen("multiclass")
    pop = Population(config("softmax", epochs=2.0), SEEDS, data, task, Members(len(SEEDS)))
    with torch.no_grad():
        pop.model.w1[1].fill_(float("inf"))  # member 1 diverges at its first step
    members = pop.reporter
    pop.run()
    assert isinstance(members, Members)
    assert list(members.reports[1][0]) [0] == "error" and len(members.reports[1]) == 1
    for i in (0, 2):  # the others train to the end, as their solo trials do
        solo = Solo()
        run_trial({**config("softmax", epochs=2.0), "seed": SEEDS[i]}, data, task, solo)
        assert_same_run(solo.reports, members.reports[i], f"member {i}")


@pytest.mark.parametrize(("over", "data_kind", "expected"), [
    ({"skip_masked_rows": True, "loss": "as_softmax"}, "multiclass", "skip_masked_rows: expected false"),
    ({"precision": "fp16"}, "multiclass", "precision: expected fp32 or bf16"),
    ({}, "token", "a population trains frozen-feature heads of sentence tasks"),
])
def test_what_cannot_be_a_population_is_refused_with_the_reason(over: dict[str, Any], data_kind: str,
                                                                expected: str) -> None:
    data, task = frozen("multiclass")
    if data_kind == "token":
        data.kind = "token"
    cfg = {**config("softmax"), **over}
    with pytest.raises(ValueError, match=expected):
        Population(cfg, SEEDS, data, task, Members(3), device=torch.device("cpu"))


def test_seeds_must_be_distinct() -> None:
    data, task = frozen("multiclass")
    with pytest.raises(ValueError, match="distinct seeds"):
        Population(config("softmax"), (1, 1), data, task, Members(2))
