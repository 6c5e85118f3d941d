"""The tables of docs/results.md, from the answers `benchmarks/run_study.sh` printed (one `<task>.out` per task).

    python benchmarks/study_page.py /tmp/tune_as_study > /tmp/study_tables.md

Every cell comes from an answer's own verdict table (the Markdown table the search printed and logged to its
parent run as ranking.md): the verdict word with its seeds, the simultaneous interval, the best loss by
validation and the set that cannot be told apart from it, and the answer's Compute line. Nothing is
re-computed here; the paper's figures (AS-Softmax paper, Tables 2 and 8) are quoted for the comparison.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The paper's direction per task (fine-tuned BERT-base / RoBERTa, single runs): (AS-Softmax - softmax,
# AS-Speed - softmax: the comparisons our answers make, both against the baseline), in points of the task's metric. Table 2 (sst5, clinc_oos, conll2003; multi-label:
# Eurlex / WOS micro-F1, against Eq. 14) and Table 8 (GLUE). None: the paper has no figure.
PAPER: dict[str, tuple[float | None, float | None, str]] = {
    "clinc_oos": (89.07 - 88.60, 88.78 - 88.60, "Table 2"),
    "sst5": (53.12 - 51.90, 52.53 - 51.90, "Table 2"),
    "conll2003": (91.03 - 90.56, 90.58 - 90.56, "Table 2"),
    "mrpc": (90.72 - 89.41, None, "Table 8"),
    "rte": (69.31 - 68.23, None, "Table 8"),
    "cola": (64.55 - 62.44, None, "Table 8"),
    "digits": (None, None, "not in the paper"),
    "goemotions": (68.99 - 68.73, 68.70 - 68.73, "Table 2, Eurlex micro-F1 (no GoEmotions row)"),
}
AS_LOSS = {"goemotions": "multilabel_as_softmax"}  # the AS-Softmax of a multi-label task (Eq. 18)


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
    return f"{diff} **{word}**" if word.rstrip("\u2020") in ("win", "loss", "equivalent") else f"{diff} {word}"


def best(answer: Answer) -> tuple[str, str]:
    line = next((n for n in answer.notes if n.startswith("Best on validation:")), "")
    m = re.match(r"Best on validation: (\S+?);(?: cannot be told apart from it: (.*?))? ?\(", line + " (")
    if not m:
        return "-", "-"
    return m.group(1), (m.group(2) or "none").rstrip(" ;")


def headline(answers: list[Answer]) -> str:
    out = ["| task (metric, baseline) | AS-Softmax vs baseline | AS-Speed vs baseline | best by validation | "
           "cannot be told apart from it | wins / losses / equivalent / undecided | compute |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for a in answers:
        words = [r[next(h for h in a.header if h.startswith("verdict"))] for r in a.rows.values()]
        counts = [sum(w.rstrip("\u2020") == k for w in words) for k in ("win", "loss", "equivalent")]
        counts.append(sum(w.startswith("undecided") for w in words))
        leader, company = best(a)
        m = re.search(r"\((\w+), %; ", a.title) or re.search(r"\(([\w-]+)", a.title)
        metric = m.group(1) if m else "?"
        base = next((loss for loss, r in a.rows.items() if r[next(h for h in a.header if h.startswith("verdict"))]
                     == "baseline"), "?")
        compute = re.sub(r"^Compute: ", "", a.compute)
        out.append(f"| {a.task} ({metric}, {base}) | {verdict(a, AS_LOSS.get(a.task, 'as_softmax'))} | "
                   f"{verdict(a, 'as_speed')} | {leader} | {company} | {' / '.join(map(str, counts))} | {compute} |")
    return "\n".join(out)


def paper(answers: list[Answer]) -> str:
    out = ["| task | paper: AS-Softmax − softmax | ours: AS-Softmax vs baseline | paper: AS-Speed − softmax | "
           "ours: AS-Speed vs baseline | paper source |", "| --- | --- | --- | --- | --- | --- |"]
    for a in answers:
        gain, speed, source = PAPER.get(a.task, (None, None, "-"))
        out.append(f"| {a.task} | {'-' if gain is None else f'{gain:+.2f}'} | "
                   f"{verdict(a, AS_LOSS.get(a.task, 'as_softmax'))} | {'-' if speed is None else f'{speed:+.2f}'} | "
                   f"{verdict(a, 'as_speed')} | {source} |")
    return "\n".join(out)


def main() -> None:
    folder = Path(sys.argv[1])
    answers = []
    for path in sorted(folder.glob("*.out")):
        text = path.read_text()
        if "### " not in text:
            print(f"<!-- {path.name}: no answer table (the search did not finish) -->")
            continue
        answers.append(parse(path.stem, text))
    print("## Headline\n\n" + headline(answers) + "\n\n## Against the paper\n\n" + paper(answers) + "\n")
    for a in answers:
        print(f"### {a.title}\n")
        print("| " + " | ".join(a.header) + " |\n|" + "|".join(" --- " for _ in a.header) + "|")
        for row in a.rows.values():
            print("| " + " | ".join(row.values()) + " |")
        print("\n" + "\n".join(a.notes) + "\n\n" + a.compute + "\n")


if __name__ == "__main__":
    main()
