"""The search engine: the only package (with the CLIs) that imports Ray.

    request (SearchRequest, validated once) -> plan (no Ray: task, space, base TrialSettings, data)
      -> run (one Tuner: PerLossSearcher + PerLossASHA, MlflowCallback) -> confirmation -> record (the answer's
      record, replayed by the report; the answer itself: tune_as.results)

Modules: request, plan, resume, searcher, schedulers, members, callbacks (the driver's side of a trial), worker
(what a Ray worker runs), cluster, head, interrupt, disk, folder, progress, state, record, run
(docs/architecture.md).
"""

from tune_as.engine.request import SearchRequest

__all__ = ["SearchRequest"]
