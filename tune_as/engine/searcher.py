"""One Optuna study per loss behind one Ray Tune `Searcher`.

ONE Tuner runs every loss of a search and `PerLossSearcher` keeps ONE Optuna study per loss (TPE,
multivariate, seeded, in an SQLite file optuna-dashboard can open). Each loss gets exactly its own trial
budget and TPE models each loss's own parameters, while the cluster stays full across losses (a Tuner per loss
would idle GPUs whenever one loss has fewer pending trials than there are GPUs).

Warm start: each loss's first trial is the paper's Table 6 setting where the search space has one (`paper`),
else the loss's own defaults. Without it a loss's first trial is a random draw, and with few trials per loss
the answer is a lottery: on digits one draw of taylor_softmax backward=inf trained to 18% where its defaults
reach 98% (docs/bench_efficiency.md). `sampler="random"` draws every other trial uniformly instead of by TPE
(a baseline).

Each Optuna trial mirrors its Ray trial: the objective so far at every evaluation (intermediate values), then
COMPLETE with its value, FAIL (an error, no result), or PRUNED when early stopping cut it before its epochs
(the same rule as the MLflow run's stopped-early tag, `callbacks.completed`): optuna-dashboard shows it as
pruned, and TPE ranks a pruned trial by how far it got, then by its last value, as after Optuna's own pruning.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
import warnings
import zlib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from ray.tune.search import Searcher

from tune_as.engine import links
from tune_as.engine.callbacks import completed
from tune_as.engine.state import (
    SEARCHER_FILES,
    SEARCHER_WHAT,
    fixed_searcher_state,
    loss_searcher_state,
    read_json,
    write_json,
)
from tune_as.engine.storage import SavedTrial
from tune_as.settings import TrialSettings
from tune_as.space.search_space import TRIAL_KEYS, LossSpace, SearchSpace, config_key
from tune_as.tracking import schema

# One "A new study created" line per loss, and one per trial, would bury Ray's progress table.
optuna.logging.set_verbosity(optuna.logging.WARNING)
# Draws in a row that may repeat a tried setting before a loss's search ends (`PerLossSearcher._ask_new`); a
# finite space ends as soon as every point is tried, so this only bounds a sampler stuck on one
# continuous point.
MAX_ASKS = 50
MAX_LISTED = 100_000  # a finite space listed to enqueue an untried point; a larger one just draws again
REPEATS = 5  # repeats in a row before a finite space's next point is an untried one, enqueued
# An intermediate value's step: the samples a trial has seen (an int that grows with training, comparable
# across a loss's trials; the epoch is fractional when evaluations fall inside epochs).
STEP = "samples_seen"
# Tune hands a searcher its results flattened (tune_controller, flatten_dict)
PLANNED_EPOCHS = "config/epochs"


def warm_start(space: LossSpace) -> dict[str, Any]:
    """A loss's first trial (search-space names): its `paper` setting, else its defaults (the loss
    constructor's, TrialSettings's for trial settings such as warmup_r) for each searched parameter whose
    default is in range. Parameters left out are drawn by the sampler."""
    if space.paper:
        return {d.name: space.paper[d.name] for d in space.params if d.name in space.paper}
    from tune_as.losses import LOSSES

    trial = {f.name: f.default for f in dataclasses.fields(TrialSettings)}
    hparams = LOSSES[space.loss]().hparams()
    point = {}
    for d in space.params:
        value = trial.get(d.name) if d.name in TRIAL_KEYS else hparams.get(d.name)
        if value is not None and d.contains(value):
            point[d.name] = value
    return point


def _point(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


class _Searcher(Searcher):
    """What tune_as's searchers share: they count their live trials against --max-concurrent themselves
    (`set_max_concurrency`), and a searcher unpickled from an older search's `tuner.pkl` gets, in one place,
    the attributes added since (`_ADDED`: name -> default, copied)."""

    _ADDED: dict[str, Any] = {}
    max_concurrent: int | None = None  # trials at a time (`set_max_concurrency`); None: not limited here

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({name: copy.copy(value) for name, value in self._ADDED.items()
                              if name not in state})
        self.__dict__.update(state)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Ray's protocol for a searcher that limits itself: True, so the ConcurrencyLimiter around it passes
        calls through and keeps no count of live trials in Ray's pickled state, which a killed driver can
        leave behind or ahead of the trials Ray saved; the searcher's own count (`live`) is caught up before a
        restore (`catch_up`). The wrapper stays: Ray sizes its queue of pending trials by it (else one at a
        time)."""
        self.max_concurrent = max_concurrent
        return True

    def _full(self, live: Collection[Any]) -> bool:
        return self.max_concurrent is not None and len(live) >= self.max_concurrent


class PerLossSearcher(_Searcher):
    """Losses take turns (the one with the fewest suggestions goes next), so each gets its quota."""

    _ADDED = {**_Searcher._ADDED, "_storage": None, "sampler": "tpe", "warm": True, "quota": None,
              "exhausted": set(), "orphans": {}, "_ids": {}}

    def __init__(self, space: SearchSpace, base: TrialSettings, storage_url: str, study_prefix: str,
                 metric: str, seed: int, sampler: str = "tpe", warm: bool = True,
                 quota: dict[str, int] | None = None) -> None:
        super().__init__(metric=metric, mode="max")
        self.space, self.base, self.storage_url = space, base.to_dict(), storage_url
        self.study_prefix, self.seed, self.sampler, self.warm = study_prefix, seed, sampler, warm
        self.suggested = {loss: 0 for loss in space.losses}
        self.quota = quota or dict.fromkeys(space.losses, space.trials_per_loss)  # search trials per loss
        self.live: dict[str, tuple[str, int]] = {}  # Ray trial id -> (loss, Optuna trial number)
        self.exhausted: set[str] = set()  # losses whose every setting has been tried (finite spaces)
        self.orphans: dict[str, list[int]] = {}  # per loss, Optuna trials a restart closed before they ran
        self._studies: dict[str, optuna.Study] = {}
        self._storage: optuna.storages.RDBStorage | None = None
        self._ids: dict[tuple[str, int], int] = {}  # (loss, Optuna trial number) -> the storage's trial id

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.quota is None:  # pickled before quotas per loss: every loss had the space's
            self.quota = dict.fromkeys(self.space.losses, self.space.trials_per_loss)

    def storage(self) -> optuna.storages.RDBStorage:
        """Every loss's study in one storage; its public API is how a value reaches a trial known by its
        number (a Ray trial outlives the driver's `optuna.trial.Trial` objects: a resumed search has only
        numbers)."""
        storage = self._storage
        if storage is None:
            storage = self._storage = optuna.storages.RDBStorage(self.storage_url)
        return storage

    def study(self, loss: str) -> optuna.Study:
        if loss not in self._studies:
            seed = self.seed + zlib.crc32(loss.encode()) % 10_000
            sampler: optuna.samplers.BaseSampler = (
                optuna.samplers.RandomSampler(seed=seed) if self.sampler == "random"
                else optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True))
            study = optuna.create_study(study_name=schema.study_name(self.study_prefix, loss),
                                        storage=self.storage(), direction="maximize", sampler=sampler,
                                        load_if_exists=True)
            if study.metric_names is None:  # optuna-dashboard shows the objective by this name
                # "experimental" since Optuna 3.2, stable in use; not the user's
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.set_metric_names([str(self.metric)])
            point = warm_start(self.space.losses[loss]) if self.warm else {}
            if point and not study.trials:
                study.enqueue_trial(point)
            self._studies[loss] = study
        return self._studies[loss]

    # FINISHED is a str
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if self._full(self.live):
            return None
        while True:
            open_losses = [loss for loss in self.space.losses
                           if self.suggested[loss] < self.quota[loss] and loss not in self.exhausted]
            if not open_losses:
                return Searcher.FINISHED
            loss = min(open_losses, key=lambda name: self.suggested[name])
            asked = self._ask_new(loss)
            if asked is not None:
                break
            # every point of its space has been tried: its remaining trials are not run
            self.exhausted.add(loss)
        trial, params = asked
        links.mark(trial, trial_id)  # its MLflow run finds it by this (tune_as.engine.links)
        space = self.space.losses[loss]
        if not space.params:  # nothing to tune: repeat over seeds, so every loss is "best of N" alike
            params["seed"] = self.base["seed"] + self.suggested[loss]
        self.suggested[loss] += 1
        self.live[trial_id] = (loss, trial.number)
        return {**self.base, **space.constants(), "loss": loss, **params}

    def _ask_new(self, loss: str) -> tuple[optuna.trial.Trial, dict[str, Any]] | None:
        """An Optuna trial of `loss` whose setting no earlier trial of this search has, with its trial config
        params; None when the loss's finite space has no untried point left.

        Every search trial of a loss runs on the same seed, so a repeated setting is the same run: TPE and
        random sampling of a small discrete space repeat points (taylor_softmax's 10 settings, an integer k),
        which trained the same run twice and counted it as two trials. Optuna has no option to sample without
        repetition, hence this check (hand-written). A repeat is closed as failed (TPE ignores failed trials,
        so the original's result is not counted twice) and marked `repeat_of` (optuna-dashboard shows it). In
        a finite space, after REPEATS repeats in a row, an untried point drawn with the study's seed is
        enqueued, so a loss runs min(quota, points) trials (`LossSpace.size`; the engine expects that many). A
        continuous space takes its MAX_ASKS-th draw as it is."""
        space = self.space.losses[loss]
        study = self.study(loss)
        size = space.size()
        listed = size is not None and size <= MAX_LISTED  # larger: drawn like a continuous space
        for attempt in range(MAX_ASKS):
            trial = study.ask()
            params = {config_key(d.name): d.suggest(trial) for d in space.params}
            if not listed and (not space.params or attempt == MAX_ASKS - 1):
                return trial, params
            tried = [t for t in study.get_trials(deepcopy=False)
                     if t.number != trial.number and self._tried(loss, t)]
            first = next((t for t in tried if t.params == trial.params), None)
            if first is None:
                return trial, params
            trial.set_user_attr("repeat_of", first.number)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            if not listed:
                continue
            seen = {_point(t.params) for t in tried if len(t.params) == len(space.params)}
            if len(seen) >= (size or 0):
                return None
            if attempt + 1 >= REPEATS:
                untried = [p for p in space.points() if _point(p) not in seen]
                rng = random.Random(f"{self.seed}/{loss}/{len(study.trials)}")
                study.enqueue_trial(rng.choice(untried))
        raise AssertionError("unreachable: a finite space enqueues an untried point after REPEATS repeats")

    def _tried(self, loss: str, t: optuna.trial.FrozenTrial) -> bool:
        """Whether a study's trial stands for a run of its setting: not a repeat (told failed in its place),
        not an orphan a driver restart closed before it ran. A failed run counts: the same setting on the same
        seed fails again."""
        return "repeat_of" not in t.user_attrs and t.number not in self.orphans.get(loss, ())

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.live:
            self._report(*self.live[trial_id], result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        if trial_id not in self.live:
            return
        loss, number = self.live.pop(trial_id)
        study = self.study(loss)
        if study.get_trials(deepcopy=False)[number].state.is_finished():
            return  # told before a driver restart whose searcher checkpoint predates the tell
        value = None if (error or not result or result.get("error")) else result.get(self.metric)
        if result is None or value is None:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
        else:
            # Tune passes the result it stopped a trial on to no on_trial_result
            self._report(loss, number, result)
            planned = result.get(PLANNED_EPOCHS)
            if planned is not None and not completed(result, float(planned)):
                # valued by its last intermediate value
                study.tell(number, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(number, value, state=optuna.trial.TrialState.COMPLETE)
        self._ids.pop((loss, number), None)

    def _report(self, loss: str, number: int, result: dict[str, Any]) -> None:
        """The trial's objective so far as its Optuna trial's intermediate value at STEP (a step reported
        again, by a trial resumed from an earlier checkpoint, is overwritten with the same value)."""
        value, step = result.get(self.metric), result.get(STEP)
        if value is None or step is None or result.get("error"):
            return
        storage, ids = self.storage(), self._ids
        if (loss, number) not in ids:
            study_id = storage.get_study_id_from_name(schema.study_name(self.study_prefix, loss))
            ids[(loss, number)] = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # told before a driver restart
            storage.set_trial_intermediate_value(ids[(loss, number)], int(step), float(value))

    def save(self, checkpoint_path: str) -> None:
        # Ray calls save/restore with a path in the experiment's folder: the file is JSON, never a pickle
        write_json(Path(checkpoint_path), {"suggested": self.suggested, "live": self.live,
                                           "exhausted": sorted(self.exhausted), "orphans": self.orphans})

    def restore(self, checkpoint_path: str) -> None:
        saved = loss_searcher_state(read_json(Path(checkpoint_path), SEARCHER_WHAT), Path(checkpoint_path))
        self.suggested, self.live = saved["suggested"], saved["live"]
        self.exhausted, self.orphans = saved["exhausted"], saved["orphans"]
        # Optuna trials asked after the last searcher checkpoint belong to no Ray trial: close them.
        self.close_running(keep={(loss, number) for loss, number in self.live.values()})

    def close_running(self, keep: Collection[tuple[str, int]] = ()) -> None:
        """Close each Optuna trial still running, but those in `keep` ((loss, number)), as an orphan: failed,
        and never counted as a tried setting (`_tried`), so its setting can be drawn again."""
        for loss in self.space.losses:
            for t in self.study(loss).get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if (loss, t.number) not in keep:
                    self.study(loss).tell(t.number, state=optuna.trial.TrialState.FAIL)
                    self.orphans.setdefault(loss, []).append(t.number)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # studies live in the database, not in pickles
        state["_studies"], state["_storage"], state["_ids"] = {}, None, {}
        return state


class FixedConfigs(_Searcher):
    """Hands out given configs, once each, in order (confirmation runs of selected settings)."""

    _ADDED = {**_Searcher._ADDED, "live": set()}

    def __init__(self, configs: list[dict[str, Any]], metric: str) -> None:
        super().__init__(metric=metric, mode="max")
        self.configs, self.next = configs, 0
        self.live: set[str] = set()

    # FINISHED is a str
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if self.next >= len(self.configs):
            return Searcher.FINISHED
        if self._full(self.live):
            return None
        self.next += 1
        self.live.add(trial_id)
        return dict(self.configs[self.next - 1])

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        self.live.discard(trial_id)

    def save(self, checkpoint_path: str) -> None:
        write_json(Path(checkpoint_path), {"next": self.next, "live": sorted(self.live)})

    def restore(self, checkpoint_path: str) -> None:
        self.next, self.live = fixed_searcher_state(read_json(Path(checkpoint_path), SEARCHER_WHAT),
                                                    Path(checkpoint_path))


def catch_up(experiment_dir: Path, trials: Sequence[SavedTrial], searcher: PerLossSearcher | None = None,
             before: Mapping[str, int] | None = None) -> bool:
    """Bring the searcher state saved in an experiment's folder (the newest file, as Ray picks it) up to
    `trials`, the trials Ray saved beside it (engine.storage.saved_trials), before Ray restores both; whether
    it changed. `searcher`: the search's (its Optuna studies), None for FixedConfigs; `before`: per loss, the
    trials of the search's earlier parts (engine.run).

    Ray saves an experiment's trials and its searcher's state as two files, copied side by side: a driver
    killed inside the copy can leave the searcher's state behind the trials (it would hand out again what Ray
    already has: a confirmation seed run twice, a loss's trial beyond its quota) or ahead of them (engine.run
    runs what Ray lost in a part). Made consistent here (hand-written: Ray restores each file as it finds it):
    the state counts every saved trial, FixedConfigs' `next` and each loss's count, and its live trials are
    exactly Ray's unfinished ones, each of a search matched to the Optuna trial of its loss still running with
    its setting (the others are closed as orphans when the searcher restores)."""
    path = max(experiment_dir.glob(SEARCHER_FILES), default=None, key=str)
    if path is None:
        return False
    saved = read_json(path, SEARCHER_WHAT)
    unfinished = [t for t in trials if not t.ended]
    if searcher is None:
        nxt, had = fixed_searcher_state(saved, path)
        state: dict[str, Any] = {"next": max(nxt, len(trials)),
                                 "live": sorted(t.trial_id for t in unfinished)}
        changed = state != {"next": nxt, "live": sorted(had)}
        if changed:
            write_json(path, state)
        return changed
    old = loss_searcher_state(saved, path)
    counts = Counter(str(t.config.get("loss")) for t in trials)
    suggested = {loss: max(n, (before or {}).get(loss, 0) + counts[loss])
                 for loss, n in old["suggested"].items()}
    live = {t.trial_id: old["live"][t.trial_id] for t in unfinished if t.trial_id in old["live"]}
    for t in unfinished:
        loss = str(t.config.get("loss"))
        if t.trial_id in live or loss not in searcher.space.losses:
            continue
        taken = set(live.values())
        running = searcher.study(loss).get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        match = next((o for o in running if (loss, o.number) not in taken
                      and all(t.config.get(config_key(name)) == value
                              for name, value in o.params.items())), None)
        if match is not None:
            live[t.trial_id] = (loss, match.number)
    if (suggested, live) == (old["suggested"], old["live"]):
        return False
    searcher.suggested, searcher.live, searcher.exhausted, searcher.orphans = (
        suggested, live, old["exhausted"], old["orphans"])
    searcher.save(str(path))
    return True
