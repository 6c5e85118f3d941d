"""The search engine: the only package (with the CLIs) that imports Ray. Read `run.run_search` first.

    request (SearchRequest) -> plan (no Ray: task, space, base TrialSettings, data) -> session (Ray, the
      MLflow parent run, the folder) -> run (the search's Tuner) -> confirm (the race's rounds) -> record (the
      answer's record, replayed by the report; the answer itself: tune_as.results)

Modules (tests/test_imports.py keeps this list equal to the package's):
- request: what a user asks, each option declared once; check() needs nothing but the request
- plan: the request resolved into task, space, settings and prepared data; nothing written but the data cache
- checks: the checks planning runs before anything is written
- resume: what a resumed search restores and what it may change
- session: Ray, the MLflow parent run, the folder, and the Tuners (new, restored, fitted)
- run: the spine: plan, open, search, confirm, decide, record, print
- confirm: the race's rounds of new seeds, and the report's --confirm
- record: the answer's record and what a search cost
- searcher: one Optuna study per loss behind one Ray Searcher
- schedulers: ASHA rungs per loss
- members: populations (seeds of one setting in one trial) and their fan-out
- callbacks: the driver's side of a trial (MLflow runs, names, checkpoints dropped)
- links: an Optuna trial, its MLflow run and its Ray trial name each other
- worker: what a Ray worker runs
- progress: the live view of the trials
- cluster: start or join Ray, a trial's resources
- concurrency: trials at a time, following the cluster's resources while a search runs
- head: a local search's Ray, started at the CLI's first line
- lifeline: a joined cluster's head, polled: its loss ends the search in seconds
- interrupt: signals that reach Ray too
- disk: a full disk ends the search cleanly
- folder: the search's folder: lock, state, resume hint
- state: JSON state for --resume, the private-folder check
- storage: Ray's experiments on whole files, and their restore
"""

from tune_as.engine.request import SearchRequest

__all__ = ["SearchRequest"]
