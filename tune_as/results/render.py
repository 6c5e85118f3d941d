"""One renderer for every table the project prints or logs: the search's answer and the report's tables."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field


def fmt_value(v: str) -> str:
    """Params are strings in MLflow: shorten floats (0.30000000000000004 -> 0.3, 0.8963863270334698 -> 0.896),
    keep the rest; the exact values stay in MLflow and the search folder."""
    try:
        x = float(v)
    except ValueError:
        return v
    return v if v.lstrip("-").isdigit() else f"{x:.3g}"


@dataclass(frozen=True)
class Table:
    name: str  # file stem, e.g. "table6"
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)  # printed under the Markdown table; not in the CSV

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |",
                 "|" + "|".join(" --- " for _ in self.header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += ["", *self.notes] if self.notes else []
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return buf.getvalue()
