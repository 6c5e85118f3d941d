"""Each search's answer in a tracking store, replayed under every noise model: the comparisons each decides.

    python tools/replay_rules.py --tracking-uri sqlite:////tmp/study/mlflow.db

For every search parent run with an answer record (answer.json), the race is decided again on the very same
confirmation runs with `racing.decide`, once per noise model (tune_as.results.noise: "moderated",
"per-loss", and the simulation's "pooled", invalid under unequal noise: shown only as a ceiling). Prints one
line per search and the totals. Reads the store; writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tune_as.report import answers  # noqa: E402
from tune_as.report.runs import connect  # noqa: E402
from tune_as.results import noise, racing, ranking  # noqa: E402
from tune_as.tracking import schema  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", required=True)
    a = p.parse_args()
    client = connect(a.tracking_uri)
    totals = dict.fromkeys(noise.NOISES, 0)
    compared = 0
    for experiment in client.search_experiments():
        for parent in client.search_runs([experiment.experiment_id],
                                         filter_string=f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'"):
            replayed = answers.replay(client, parent)
            if isinstance(replayed, str) or replayed.record is None or replayed.record.race is None:
                continue
            record = replayed.record
            assert record.race is not None
            named = {run_id for round_ids in record.rounds for run_id in round_ids}
            children = client.search_runs([experiment.experiment_id], max_results=5000, filter_string=(
                f"tags.`{schema.SEARCH}` = '{answers.search_name(parent)}' and "
                f"tags.`{schema.ROLE}` = '{schema.ROLE_CONFIRMATION}'"))
            runs = [r for c in children if (r := answers.engine_run(c, record.metric, True)) is not None
                    and r.run_id in named]
            results = ranking.race_results(runs, record.metric)
            counts = {}
            for rule in noise.NOISES:
                plan = dataclasses.replace(record.race, noise=rule, spending=None)
                decided = racing.decide(results, plan, 0)
                counts[rule] = sum(row.verdict != "undecided" for row in decided.rows)
                totals[rule] += counts[rule]
            n = len(record.losses) - 1
            compared += n
            print(f"{record.task:>12} {answers.search_name(parent)}: {n} comparisons; "
                  + ", ".join(f"{rule} {count}" for rule, count in counts.items()))
    print(f"{'total':>12}: {compared} comparisons; "
          + ", ".join(f"{rule} {count} ({count / max(compared, 1):.1%})" for rule, count in totals.items()))


if __name__ == "__main__":
    main()
