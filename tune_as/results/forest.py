"""The headline answer as one figure: each loss's difference to the baseline with its simultaneous interval,
coloured by its verdict, against the equivalence margin (a forest plot, `answer.png` on the search's parent
run and in the report).

Drawn from the answer's own decision (`Answered.decision`), never re-derived: the points, intervals and words
are the table's. Axes in points of the metric, as the tables are; the best set's members are starred. Losses
without a difference (no result, or the baseline itself) are not drawn: the table lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tune_as.results import verdicts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tune_as.results.answer import Answered

# Okabe & Ito's colour-blind-safe colours, one per verdict word (the first word of verdict_word's text)
VERDICT_COLOURS = {"win": "#009E73", "loss": "#D55E00", "equivalent": "#0072B2", "undecided": "#999999"}
BEST_MARK = "\u2605"  # a star before a loss of the best set


def forest(answered: Answered, margin_points: float, baseline: str, metric: str, path: Path,
           title: str = "") -> Figure | None:
    """Draw the answer's forest plot into `path` (PNG) and return the closed figure; None when the answer has
    no confirmed difference to draw (no confirmation, or no loss with a result beside the baseline)."""
    decision = answered.decision
    if decision is None:
        return None
    margin = verdicts.points(margin_points)
    drawn = [r for r in decision.rows if r.mean_diff is not None and r.interval is not None]
    if not drawn:
        return None
    drawn.sort(key=lambda r: (r.mean_diff or 0.0, r.loss))  # the largest difference on top
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(drawn) + 1.6))
    ax.axvspan(-margin_points, margin_points, color="#0072B2", alpha=0.08, lw=0,
               label=f"equivalence margin ±{margin_points:g}")
    ax.axvline(0.0, color="#000000", lw=0.8)
    words = []
    for y, row in enumerate(drawn):
        word = verdicts.verdict_word(row, margin)
        colour = VERDICT_COLOURS.get(word.split(" ")[0].rstrip("\u2020"), VERDICT_COLOURS["undecided"])
        low, high = (100 * v for v in row.interval)  # type: ignore[union-attr]
        mean = 100 * (row.mean_diff or 0.0)
        ax.plot([low, high], [y, y], color=colour, lw=2.2, solid_capstyle="butt")
        ax.plot([mean], [y], "o", color=colour, ms=6)
        words.append(f"{word}  {mean:+.2f} [{low:+.2f}, {high:+.2f}]")
    best = set(decision.best)
    ax.set_yticks(range(len(drawn)), [f"{BEST_MARK} {r.loss}" if r.loss in best else r.loss for r in drawn])
    if best & {r.loss for r in drawn} or baseline in best:
        ax.plot([], [], " ", label=f"{BEST_MARK} in the best set on validation (tied, not ranked)"
                                   + (f"; {baseline} too" if baseline in best else ""))
    ax.set_xlabel(f"difference to {baseline}, points of {metric} (simultaneous intervals)")
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(len(drawn)), words)
    right.tick_params(length=0)
    ax.set_ylim(-0.7, len(drawn) - 0.3)
    legend = ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False, fontsize="small")
    if title:  # above the legend's lines
        ax.set_title(title, loc="left", fontsize="medium", pad=8 + 14 * len(legend.get_texts()))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return fig
