"""A search's saved views of the MLflow UI's runs table: loss, accuracy in percent and setting, unasked.

MLflow 3.17's runs table shows each run's name, start, duration, dataset, source and models by default: no
metric and no parameter. Those default columns are the browser's (kept in its local storage per experiment);
neither the server nor an experiment tag sets them. An experiment can hold saved views, though (the table's
"Views" menu): one experiment tag each, `schema.VIEW_TAG_PREFIX + key`, whose value is JSON (a name, times
and the view's state: filter, sort, columns, grouping), and the page address `runs?viewStateShareKey=<key>`
opens one (`schema.ui_page`). A search saves two, keyed by its id (`schema.view_key`):

- its runs, the best validation first: each run's name (the loss: `as_softmax_0003`, `as_softmax_seed2`),
  its best validation and test metric in percent (`schema.with_percent`), its setting (`schema.SETTING`), its
  role (search trial or confirmation) and whether early stopping cut it. The search prints its address.
- a confirmed search's confirmation runs grouped by loss: each group's row averages its seeds, the val % and
  test % of the answer's table.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from tune_as.tracking.schema import (
    LOSS,
    PERCENT_SUFFIX,
    ROLE,
    ROLE_CONFIRMATION,
    SEARCH,
    SETTING,
    STOPPED_EARLY,
    VIEW_TAG_PREFIX,
    view_key,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

NAME_COLUMN = "attributes.`Run Name`"  # the runs table's column ids: its own, then `<kind>.`<key>``
FIXED_COLUMNS = ("1", NAME_COLUMN, "runDateAndNestInfo", "duration")  # checkbox, name, start, duration


def column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"


def states(search_id: str, metric: str, confirmed: bool) -> dict[str, tuple[str, dict[str, Any]]]:
    """The search's views: key -> (name in the Views menu, state)."""
    val, test = (column("metrics", f"{prefix}{metric}{PERCENT_SUFFIX}") for prefix in ("best_val_", "test_"))
    mine = f"tags.`{SEARCH}` = '{search_id}'"
    runs = [val, test, column("tags", SETTING), column("tags", ROLE), column("tags", STOPPED_EARLY)]
    # wide enough for a confirmation run's name (`sm_taylor_softmax_seed10`), the metrics' names and a setting
    widths = {NAME_COLUMN: 230, val: 170, test: 150, column("tags", SETTING): 240, column("tags", ROLE): 105,
              column("tags", STOPPED_EARLY): 150}
    views = {view_key(search_id): (f"{search_id}: runs, {metric} %", {
        "searchFilter": mine, "orderByKey": val, "orderByAsc": False, "selectedColumns": runs,
        "columnOrder": [*FIXED_COLUMNS, *runs], "columnWidths": widths})}
    if confirmed:
        by_loss = [val, test, column("tags", SETTING)]
        views[view_key(search_id, grouped=True)] = (f"{search_id}: confirmations by loss, mean {metric} %", {
            "searchFilter": f"{mine} and tags.`{ROLE}` = '{ROLE_CONFIRMATION}'", "orderByKey": val,
            "orderByAsc": False, "selectedColumns": by_loss, "columnOrder": [*FIXED_COLUMNS, *by_loss],
            "columnWidths": {**widths, NAME_COLUMN: 280, val: 215, test: 215},
            "groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "tag", "groupByData": LOSS}]}})
    return views


def save(client: MlflowClient, experiment_id: str, search_id: str, metric: str, confirmed: bool) -> None:
    """Save (or, on resume, save again) the search's views in its experiment."""
    now = int(time.time() * 1000)
    for key, (name, state) in states(search_id, metric, confirmed).items():
        client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, json.dumps(
            {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}))
