"""The checks planning runs before anything is written (engine.plan), in its order: the request and the
folders it writes (`check_request`), the losses apply to the task, the resolved settings (`check_settings`:
the baseline, populations, sequences that fit the backbone, a setting only some losses support), and every
loss's fewest epochs train at least one optimizer step. Each failure is a UserError that names the option at
fault. `setting_values` and `cache_dir` are shared with planning."""

from __future__ import annotations

import os
from pathlib import Path

from tune_as.engine.request import SearchRequest
from tune_as.errors import UserError
from tune_as.paths import check_temp_dir, check_writable_folder, resolved
from tune_as.settings import DataSettings, TrialSettings
from tune_as.space.search_space import SearchSpace
from tune_as.tasks import Task
from tune_as.training.population import applies as population_applies


def setting_values(space: SearchSpace, base: TrialSettings, loss: str, key: str) -> list[float]:
    """Every value of `key` (epochs, batch_size) a trial of `loss` can get: its own `fixed` value, else the
    base's; the extremes of its searched range; its paper setting (the warm start)."""
    own = space.losses[loss]
    searched = [float(v) for d in own.params if d.name == key for v in d.extremes()]
    paper = (own.paper or {}).get(key)
    return [float(own.fixed.get(key, getattr(base, key))), *searched,
            *([float(paper)] if paper is not None else [])]


def check_one_step(space: SearchSpace, base: TrialSettings, train_rows: int) -> None:
    """Every loss's fewest epochs train at least one optimizer step (one batch of the training split): fewer
    would rank models that never trained."""
    for loss in space.losses:
        epochs = min(setting_values(space, base, loss, "epochs"))
        # rows in one step, at most
        step = min(max(setting_values(space, base, loss, "batch_size")), train_rows)
        if epochs * train_rows < step:
            raise UserError(f"--max-epochs: expected at least one optimizer step of {loss} ({step:g} of "
                            f"{train_rows} training rows: {step / train_rows:.3g} epochs), got "
                            f"{epochs:g} epochs")


def check_losses(names: tuple[str, ...], kind: str) -> None:
    from tune_as.losses import LOSSES

    for name in names:
        if name not in LOSSES:
            raise UserError(f"--losses: unknown loss {name!r}; expected some of {sorted(LOSSES)}")
        if kind not in LOSSES[name].kinds:
            applicable = sorted(k for k, cls in LOSSES.items() if kind in cls.kinds)
            raise UserError(f"--losses: {name!r} does not apply to {kind} tasks; expected some of "
                            f"{applicable}")


def check_storage(storage: Path) -> None:
    """--storage-path must be (or be creatable as) a writable folder: found now, not after Ray started."""
    check_writable_folder(storage, "--storage-path")


def cache_dir(r: SearchRequest) -> Path:
    return r.cache_dir or Path(os.environ.get("TUNE_AS_CACHE", "~/.cache/tune_as")).expanduser()


def check_cache(r: SearchRequest) -> None:
    """The data cache must be writable before data is prepared; the default lives under $HOME, which a batch
    job may not be able to write: the error names where the folder came from."""
    where = ("--cache-dir" if r.cache_dir else "$TUNE_AS_CACHE" if "TUNE_AS_CACHE" in os.environ
             else f"the data cache (~/.cache/tune_as with HOME={os.environ.get('HOME', '')}; "
                  f"--cache-dir or $TUNE_AS_CACHE move it)")
    check_writable_folder(cache_dir(r), where)


def check_length(data: DataSettings, task: Task) -> None:
    """A sequence longer than the backbone's position embeddings fails in every trial: refused now."""
    from tune_as.tasks.backbones import max_positions

    limit = max_positions(data.backbone) if task.uses_backbone else None
    if limit is not None and data.max_length > limit:
        raise UserError(f"max_length: expected at most {limit} for backbone {data.backbone!r} (its position "
                        f"embeddings), got {data.max_length}")


def check_capabilities(base: TrialSettings, space: SearchSpace) -> None:
    """A setting that only some losses support (row skipping) is refused for the others before anything
    runs."""
    from tune_as.losses import row_skipping_problem

    for loss, loss_space in space.losses.items():
        searched = any(d.name == "skip_masked_rows" for d in loss_space.params)
        skip = loss_space.fixed.get("skip_masked_rows", base.skip_masked_rows)
        problem = row_skipping_problem(loss) if skip or searched else None
        if problem:
            raise UserError(f"{problem}; set it per loss in the search space, or restrict --losses")


def check_request(r: SearchRequest) -> Path:
    """The request alone, then the folders it writes: storage, the temp folder, the data cache. The storage
    path, resolved."""
    r.check()
    storage = resolved(r.storage_path, "--storage-path")
    check_storage(storage)
    check_temp_dir()
    check_cache(r)
    return storage


def check_settings(r: SearchRequest, task: Task, space: SearchSpace, data: DataSettings,
                   base: TrialSettings) -> None:
    """What the resolved settings must allow: a frozen encoder has one to freeze, the baseline is searched and
    has company, populations apply to the model, sequences fit the backbone, each setting suits its losses."""
    if r.encoder == "frozen" and not task.uses_backbone:
        raise UserError(f"--encoder: expected finetune for {task.name} (an image task has no pretrained "
                        "encoder to freeze), got frozen")
    if r.confirm or r.race:
        from tune_as.results.ranking import baseline_for

        baseline = baseline_for(task.kind, r.baseline)
        if baseline not in space.losses:
            raise UserError(f"--baseline: expected one of the searched losses {sorted(space.losses)} "
                            f"(every verdict compares with it), got {baseline!r}; "
                            "add it to --losses or choose --baseline")
        if len(space.losses) < 2:
            raise UserError(f"--losses: expected at least two losses to confirm a comparison, got "
                            f"{list(space.losses)}")
    model = data.encoder if task.uses_backbone else "cnn"  # an image task's model is its CNN
    if r.seeds_per_trial > 1 and not population_applies(model, task.kind):
        raise UserError(f"--seeds-per-trial: expected 1 for {task.name} with encoder {data.encoder} "
                        f"(a population trains frozen-feature heads of sentence tasks and image CNNs), got "
                        f"{r.seeds_per_trial}")
    check_length(data, task)
    check_capabilities(base, space)
