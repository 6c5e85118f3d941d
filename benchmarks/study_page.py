"""The tables of docs/results.md, from the answers `benchmarks/run_study.sh` printed
(one `<task>.out` per task).

    python benchmarks/study_page.py /tmp/tune_as_study [MLFLOW_URI] > /tmp/study_tables.md

Every cell of the headline and of the paper comparison's AS-Softmax-vs-baseline columns comes from an answer's
own verdict table (the Markdown table the search printed and logged to its parent run as ranking.md): the
verdict word with its seeds, the simultaneous interval, the best loss by validation and the set that cannot be
told apart from it, and the answer's Compute line. Nothing of those is re-computed here; the paper's figures
(AS-Softmax paper, Tables 2 and 8) are quoted for the comparison.

The paper's second claim, AS-Speed against AS-Softmax, is not a comparison the answers make (each compares
every loss with the baseline). With MLFLOW_URI (the study's store), it is computed from the confirmation runs
the answers used: the paired difference on the seeds both have, with a t-interval simultaneous over the tasks
of the page (Bonferroni: alpha / (2 x tasks) per side, scipy), a family of its own at 5%.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tune_as.results.ranking import AS_SOFTMAX
from tune_as.results.verdicts import unmarked
from tune_as.tasks import TASKS

# The paper's direction per task (fine-tuned BERT-base / RoBERTa, single runs): (AS-Softmax - softmax,
# AS-Speed - softmax: the comparisons our answers make, both against the baseline), in points of the task's
# metric. Table 2 (sst5, clinc_oos, conll2003; multi-label: Eurlex / WOS micro-F1, against Eq. 14) and Table 8
# (GLUE). None: the paper has no figure.
PAPER: dict[str, tuple[float | None, float | None, str]] = {
    "clinc_oos": (89.07 - 88.60, 88.78 - 88.60, "Table 2"),
    "sst5": (53.12 - 51.90, 52.53 - 51.90, "Table 2"),
    "conll2003": (91.03 - 90.56, 90.58 - 90.56, "Table 2"),
    "mrpc": (90.72 - 89.41, None, "Table 8"),
    "rte": (69.31 - 68.23, None, "Table 8"),
    "cola": (64.55 - 62.44, None, "Table 8"),
    "digits": (None, None, "not in the paper"),
    "goemotions": (68.99 - 68.73, 68.70 - 68.73, "Table 2, Eurlex micro-F1 (no GoEmotions row)"),
    "eurlex": (68.99 - 68.73, 68.70 - 68.73, "Table 2, Eurlex micro-F1 (LexGLUE's 100 labels, fine-tuned)"),
}


def as_loss(task: str) -> str:
    """The task's AS-Softmax (Eq. 18's multi-label form on a multi-label task): tune_as.results.ranking's
    rule."""
    return AS_SOFTMAX[TASKS[task].kind] if task in TASKS else "as_softmax"


@dataclass
class Answer:
    task: str
    title: str
    header: list[str]
    rows: dict[str, dict[str, str]]
    notes: list[str] = field(default_factory=list)
    compute: str = ""

    def cell(self, loss: str, column: str) -> str:
        row = self.rows.get(loss)
        if row is None:
            return "not in the answer"
        name = next(h for h in self.header if h.startswith(column))
        return row[name]


def parse(task: str, text: str) -> Answer:
    """The last answer table printed in `text` (a resumed search prints it again at the end)."""
    start = text.rindex("### ")
    lines = text[start:].splitlines()
    title = lines[0].removeprefix("### ")
    table = [line for line in lines if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[1]] = dict(zip(header, cells, strict=True))
    notes = [line for line in lines[len(table) + 1:] if line and not line.startswith(("|", "Compute:"))]
    compute = next((line for line in lines if line.startswith("Compute:")), "")
    return Answer(task, title, header, rows, notes, compute)


def verdict(answer: Answer, loss: str) -> str:
    if loss not in answer.rows:
        return "not in the answer"
    diff, word = answer.cell(loss, "Δ"), answer.cell(loss, "verdict")
    return f"{diff} **{word}**" if unmarked(word) in ("win", "loss", "equivalent") else f"{diff} {word}"


def best(answer: Answer) -> str:
    """The best set on validation as the answer's note names it (tied members; older answers named a leader
    and its company)."""
    for note in answer.notes:
        m = re.match(r"Best set on validation \(Hsu's multiple comparisons with the best\): "
                     r"(.*?)(; its members| alone\.)", note)
        if m:
            return m.group(1)
        m = re.match(r"Best on validation: (\S+?);(?: cannot be told apart from it: (.*?))? ?\(", note + " (")
        if m:
            return ", ".join(sorted([
                m.group(1), *(x.strip() for x in (m.group(2) or "").rstrip(" ;").split(",") if x.strip())]))
    return "-"


def headline(answers: list[Answer]) -> str:
    out = ["| task (metric, baseline) | AS-Softmax vs baseline | AS-Speed vs baseline | "
           "best set by validation (tied) | wins / losses / equivalent / undecided | compute |",
           "| --- | --- | --- | --- | --- | --- |"]
    for a in answers:
        words = [r[next(h for h in a.header if h.startswith("verdict"))] for r in a.rows.values()]
        counts = [sum(unmarked(w) == k for w in words) for k in ("win", "loss", "equivalent")]
        counts.append(sum(w.startswith("undecided") for w in words))
        m = re.search(r"\((\w+), %; ", a.title) or re.search(r"\(([\w-]+)", a.title)
        metric = m.group(1) if m else "?"
        base = next((loss for loss, r in a.rows.items()
                     if r[next(h for h in a.header if h.startswith("verdict"))] == "baseline"), "?")
        compute = re.sub(r"^Compute: ", "", a.compute)
        out.append(f"| {a.task} ({metric}, {base}) | {verdict(a, as_loss(a.task))} | "
                   f"{verdict(a, 'as_speed')} | {best(a)} | {' / '.join(map(str, counts))} | {compute} |")
    return "\n".join(out)


def paper(answers: list[Answer], speed_vs: dict[str, str]) -> str:
    out = ["| task | paper: AS-Softmax − softmax | ours: AS-Softmax vs baseline | "
           "paper: AS-Speed − softmax | ours: AS-Speed vs baseline | "
           "paper: AS-Speed − AS-Softmax | ours: AS-Speed − AS-Softmax | paper source |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in answers:
        gain, speed, source = PAPER.get(a.task, (None, None, "-"))
        both = None if gain is None or speed is None else speed - gain
        out.append(f"| {a.task} | {'-' if gain is None else f'{gain:+.2f}'} | "
                   f"{verdict(a, as_loss(a.task))} | {'-' if speed is None else f'{speed:+.2f}'} | "
                   f"{verdict(a, 'as_speed')} | {'-' if both is None else f'{both:+.2f}'} | "
                   f"{speed_vs.get(a.task, '-')} | {source} |")
    return "\n".join(out)


def speed_vs_as(uri: str, tasks: list[str], alpha: float = 0.05) -> dict[str, str]:
    """task -> 'AS-Speed minus AS-Softmax' cell: mean difference [simultaneous interval] (n seeds) and the
    direction the interval shows, on the confirmation runs' test metric (validation where a task has no test
    labels: rte, cola)."""
    from tune_as.report.runs import connect, experiment_ids, trial_runs
    from tune_as.results.verdicts import paired_differences, simultaneous_interval
    from tune_as.tracking import schema

    client = connect(uri)
    found = experiment_ids(client, tasks, uri)
    values: dict[str, dict[str, dict[int, float]]] = {}
    on_val: dict[str, bool] = {}
    for exp_id, task in found.items():
        runs = trial_runs(client, [exp_id], schema.ROLE_CONFIRMATION, [])
        has_test = bool(runs) and all(f"test_{r.metric}" in r.last for r in runs)
        on_val[task] = not has_test
        for r in runs:
            value = r.last[f"test_{r.metric}"] if has_test else r.best_val
            values.setdefault(task, {}).setdefault(r.loss, {})[int(r.seed)] = value
    out = {}
    pairs = {t: (v.get("as_speed"), v.get(as_loss(t))) for t, v in values.items()}
    family = sum(a is not None and b is not None for a, b in pairs.values())
    for task, (speed, as_) in pairs.items():
        if speed is None or as_ is None:
            continue
        d = paired_differences(speed, as_)
        ci = simultaneous_interval(d, alpha / (2 * family))
        if ci is None:
            out[task] = f"{100 * d.mean():+.2f} ({len(d)} seed)" if len(d) else "no shared seed"
            continue
        shows = ("lower" if ci[1] < 0 else "higher" if ci[0] > 0 else
                 "identical runs" if not d.any() else "no difference shown")
        out[task] = (f"{100 * d.mean():+.2f} [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}] ({len(d)} seeds"
                     f"{', val' if on_val[task] else ''}) {shows}")
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    uri = sys.argv[2] if len(sys.argv) > 2 else None
    answers = []
    # the paper's order (Table 2, then its multi-label and GLUE tasks), then ours
    first = ["clinc_oos", "sst5", "conll2003", "goemotions", "mrpc", "rte", "cola", "digits"]
    for path in sorted(folder.glob("*.out"),
                       key=lambda p: (first.index(p.stem) if p.stem in first else 99, p.stem)):
        text = path.read_text()
        if "### " not in text:
            print(f"<!-- {path.name}: no answer table (the search did not finish) -->")
            continue
        answers.append(parse(path.stem, text))
    speed = speed_vs_as(uri, [a.task for a in answers]) if uri else {}
    print("## Headline\n\n" + headline(answers) + "\n\n## Against the paper\n\n" + paper(answers, speed)
          + "\n")
    for a in answers:
        print(f"### {a.title}\n")
        print("| " + " | ".join(a.header) + " |\n|" + "|".join(" --- " for _ in a.header) + "|")
        for row in a.rows.values():
            print("| " + " | ".join(row.values()) + " |")
        print("\n" + "\n".join(a.notes) + "\n\n" + a.compute + "\n")


if __name__ == "__main__":
    main()
