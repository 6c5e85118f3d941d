"""Label name <-> id mapping fitted on the training split."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import clip, excerpt


class LabelMap:
    """Ids follow the dataset's own ClassLabel order when it has one, else the sorted training labels
    (numeric order for integer labels, so GLUE's "0"/"1" keep 1 = the positive class for F1)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.ids = {name: i for i, name in enumerate(self.names)}

    @classmethod
    def fit(cls, values: Iterable[Any], order: Sequence[str] | None = None, origin: str = "train") -> LabelMap:
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
        raise ValueError(f"{origin}: expected labels that are all strings or all integers, found {found}{hint}")

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, value: Any, split: str, where: str) -> int:
        """The id of one label; `where` names its row (`path:line`) in the error."""
        if value is None:
            raise ValueError(f"{where}: expected a label in the {split} split, got null")
        key = str(value)
        if key not in self.ids:
            shown = ", ".join(clip(n, 40) for n in self.names[:10]) + (", ..." if len(self.names) > 10 else "")
            raise ValueError(f"{where}: label {excerpt(value)} in the {split} split does not occur in the training "
                             f"split; expected one of the {len(self.names)} training labels ({shown})")
        return self.ids[key]
