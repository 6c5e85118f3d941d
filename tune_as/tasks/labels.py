"""Label name <-> id mapping fitted on the training split."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import clip, excerpt


class LabelMap:
    """Ids follow the dataset's own ClassLabel order when it has one, else the sorted training labels
    (numeric order for integer labels, so GLUE's "0"/"1" keep 1 = the positive class for F1)."""

    def __init__(self, names: Sequence[str], titles: Mapping[str, str] | None = None) -> None:
        self.names = tuple(names)
        self.ids = {name: i for i, name in enumerate(self.names)}
        self.titles = dict(titles or {})  # readable names of ids (EUROVOC concepts), shown next to them

    def titled(self, titles: Mapping[str, str]) -> LabelMap:
        """The same ids, shown with `titles` (`Task.label_titles`) where a label is printed."""
        return LabelMap(self.names, titles) if titles else self

    def title(self, name: Any) -> str:
        """What follows a printed label: its title in parentheses where the data has one, else nothing."""
        title = self.titles.get(str(name))
        return f" ({clip(title, 40)})" if title else ""

    @classmethod
    def fit(cls, values: Iterable[Any], order: Sequence[str] | None = None,
            origin: str = "train") -> LabelMap:
        present = [v for v in values if v is not None]
        if not present:
            raise ValueError(f"{origin}: expected labelled training rows, found no labels")
        if order is not None:
            return cls([str(n) for n in order])
        kinds = {type(v) for v in present}
        if kinds <= {int, bool}:
            return cls([str(v) for v in sorted(set(present))])
        if kinds == {str}:
            return cls(sorted(set(present)))
        found = ", ".join(sorted(k.__name__ for k in kinds))
        hint = " (a list of labels per row needs kind 'multilabel' or 'token')" if list in kinds else ""
        raise ValueError(f"{origin}: expected labels that are all strings or all integers, "
                         f"found {found}{hint}")

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, value: Any, split: str, where: str) -> int:
        """The id of one label; `where` names its row (`path:line`) in the error."""
        if value is None:
            raise ValueError(f"{where}: expected a label in the {split} split, got null")
        key = str(value)
        if key not in self.ids:
            shown = ", ".join(clip(n, 40) + self.title(n) for n in self.names[:10])
            shown += ", ..." if len(self.names) > 10 else ""
            raise ValueError(f"{where}: label {excerpt(value)}{self.title(value)} in the {split} split "
                             "does not occur in the training split; "
                             f"expected one of the {len(self.names)} training labels ({shown})")
        return self.ids[key]
