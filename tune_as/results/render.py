"""One renderer for every table the project prints or logs: the search's answer and the report's tables."""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("table", "markdown", "csv", "json")
MACHINE_FORMATS = ("csv", "json")  # for scripts: the answer alone on stdout
NARROWEST = 60  # a terminal narrower than this still gets a table this wide (its lines then wrap)
FOLD_FLOOR = 24  # a folded column (a setting) keeps words this long whole; longer ones fold


def terminal_width() -> int:
    """The terminal's columns ($COLUMNS first), 100 when there is no terminal (a pipe, a log file)."""
    return max(NARROWEST, shutil.get_terminal_size((100, 24)).columns)


def fit(text: str, width: int | None = None) -> str:
    """A message as printed: each paragraph wrapped to the terminal's width, its continuation lines
    indented."""
    import textwrap

    width = width or terminal_width()
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False,
                                    break_on_hyphens=False) if len(line) > width else line
                      for line in text.splitlines())


def fmt_value(v: str) -> str:
    """Params are strings in MLflow: shorten floats (0.30000000000000004 -> 0.3, 0.8963863270334698 -> 0.896),
    keep the rest; the exact values stay in MLflow and the search folder."""
    try:
        x = float(v)
    except ValueError:
        return v
    return v if v.lstrip("-").isdigit() else f"{x:.3g}"


def _float(v: str) -> float | None:
    """A value that prints as a float (not an integer, not a word), as a float."""
    if v.lstrip("-").isdigit():
        return None
    try:
        return float(v)
    except ValueError:
        return None


def short_settings(settings: Sequence[Mapping[str, str]], least: int = 3) -> list[str]:
    """Each setting as "k=v, ..." (sorted keys, `loss.` dropped) for a person: a float to the fewest
    significant digits, at least `least`, at which the distinct values its key takes among `settings` print
    distinct; integers and words as they are. The exact values are in the CSV, the JSON and MLflow."""
    digits: dict[str, int | None] = {}  # None: only the shortest exact form (repr) keeps them apart
    for key in {k for setting in settings for k in setting}:
        values = {x for setting in settings if key in setting and (x := _float(setting[key])) is not None}
        digits[key] = next((d for d in range(least, 17)
                            if len({f"{x:.{d}g}" for x in values}) == len(values)), None)

    def shown(key: str, v: str) -> str:
        x, d = _float(v), digits[key]
        return v if x is None else repr(x) if d is None else f"{x:.{d}g}"

    return [", ".join(f"{k.removeprefix('loss.')}={shown(k, v)}" for k, v in sorted(setting.items()))
            for setting in settings]


def one_setting(config: Mapping[str, object], keys: Sequence[str]) -> str:
    """A trial's setting of `keys` (its config's searched keys) as `short_settings` prints it alone, to 4
    significant digits ("" for none): the progress lines and the MLflow runs table show it so."""
    return short_settings([{k: str(config[k]) for k in keys if k in config}], least=4)[0]


@dataclass(frozen=True)
class Table:
    name: str  # file stem, e.g. "table6"
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)  # printed under the Markdown table; not in the CSV
    # in a terminal, where width is scarce: a shorter header ([] = header) and a key that says what it
    # leaves out
    short_header: list[str] = field(default_factory=list)
    key: str = ""
    # columns never wrapped (names): the others wrap at spaces inside their cells
    keep_whole: tuple[int, ...] = ()
    fold: tuple[int, ...] = ()  # columns whose long words fold onto the next line (a setting's many digits)
    # the rows as a person reads them (Markdown, the terminal; [] = rows): settings to a few digits, where the
    # CSV and JSON keep them exact
    shown: list[list[str]] = field(default_factory=list)
    # in a terminal too narrow for every column whole: the columns moved to a second block, in this order
    # (the keep_whole columns head both blocks); a number is never cut
    spill: tuple[int, ...] = ()

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |",
                 "|" + "|".join(" --- " for _ in self.header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.shown or self.rows]
        lines += ["", *self.notes] if self.notes else []
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return buf.getvalue()

    def json(self) -> str:
        """For scripts: the title, each row as {column: cell} (the full header's names) and the notes."""
        return json.dumps({"title": self.title,
                           "rows": [dict(zip(self.header, row, strict=True)) for row in self.rows],
                           "notes": self.notes}, indent=1, ensure_ascii=False) + "\n"

    def render(self, fmt: str, width: int | None = None) -> str:
        """The table in one of FORMATS: "table" (the terminal's), "markdown", "csv" or "json"."""
        if fmt not in FORMATS:
            raise ValueError(f"expected a format in {FORMATS}, received {fmt!r}")
        return self.terminal(width) if fmt == "table" else getattr(self, fmt)()

    def terminal(self, width: int | None = None) -> str:
        """The table as a person reads it in a terminal: boxed, `width` columns wide at most (default: the
        terminal's, $COLUMNS, else 100), each cell wrapped inside its column at spaces (no line of the output
        is wider than `width`), the notes wrapped beneath. Where the columns cannot all be whole at this width
        (each at least its longest word), the `spill` columns move to further blocks headed by the
        keep_whole columns: a number is never cut. Rich lays it out; no colour, so the text is the same on a
        TTY, in a pipe and in a log."""
        from rich.console import Console
        from rich.markup import escape

        width = max(NARROWEST, width or terminal_width())
        out = io.StringIO()
        console = Console(file=out, width=width, color_system=None, highlight=False, emoji=False)
        header = self.short_header or self.header

        columns = list(range(len(header)))
        floor = dict(zip(columns, self._floors(header, columns), strict=True))

        def fits(block: list[int]) -> bool:
            return sum(floor[i] for i in block) + 2 * len(block) <= width

        moved: list[int] = []
        for i in self.spill:
            if fits(columns):
                break
            columns.remove(i)
            moved.append(i)
        blocks = [columns]
        keys = [i for i in self.keep_whole if i not in moved]
        while moved:  # the moved columns in as few more blocks as fit, each headed by the keys
            block = [*keys]
            for i in sorted(moved):
                if len(block) == len(keys) or fits([*block, i]):
                    block.append(i)
            moved = [i for i in moved if i not in block]
            blocks.append(sorted(block))
        for n, block in enumerate(blocks):
            console.print(self._rich(header, block, width, escape(self.title) if n == 0 else "(continued)"))
        for note in ([self.key] if self.key else []) + self.notes:
            console.print(escape(note))
        return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"

    def _rich(self, header: list[str], columns: list[int], width: int, title: str) -> Any:
        """A rich table of `columns` (indexes into the header and the rows), fitted to `width`."""
        from rich import box
        from rich.markup import escape
        from rich.table import Table as RichTable

        table = RichTable(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                          title_justify="left")
        for i, cells in zip(columns, self._widths(header, columns, width - 2 * len(columns)), strict=True):
            table.add_column(escape(header[i]), width=cells, no_wrap=i in self.keep_whole,
                             overflow="fold" if i in self.fold else "ellipsis")
        for row in self.shown or self.rows:
            table.add_row(*(escape(row[i]) for i in columns))
        return table

    def _floors(self, header: list[str], columns: list[int]) -> list[int]:
        """Each column's least width: a kept-whole column's widest cell, else its longest word (a folded
        column's at most FOLD_FLOOR: longer words fold onto the next line)."""
        rows = self.shown or self.rows
        out = []
        for i in columns:
            cells = [header[i], *(row[i] for row in rows)]
            longest = max(len(word) for cell in cells for word in cell.split() or [""])
            out.append(max(map(len, cells)) if i in self.keep_whole else min(FOLD_FLOOR, longest)
                       if i in self.fold else longest)
        return out

    def _widths(self, header: list[str], columns: list[int], room: int) -> list[int]:
        """Widths of `columns` that fit `room` characters: each as wide as its longest cell, then the widest
        wrappable column narrowed one character at a time, never below its floor (`_floors`). Hand-written:
        rich shares the room in proportion to the widest cells, which left 10 characters to "81.00 ±" while
        "equivalent" was cut to "equivale…"."""
        rows = self.shown or self.rows
        widths = [max(len(cell) for cell in [header[i], *(row[i] for row in rows)]) for i in columns]
        floors = self._floors(header, columns)
        while sum(widths) > room:
            slack, k = max((w - f, k) for k, (w, f) in enumerate(zip(widths, floors, strict=True)))
            if slack <= 0:
                break  # narrower than every column's floor: rich wraps the lines
            widths[k] -= 1
        return widths
