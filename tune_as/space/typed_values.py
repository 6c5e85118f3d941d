"""A user's value (a YAML value or command-line text) as the type a dataclass field declares.

The search space's values and `--set KEY=VALUE` are typed here, by `TrialConfig`'s annotations and by the
type of a loss hyper-parameter's default, so `2e-5` (a string to YAML 1.1) is the float 2e-5 everywhere.
"""

from __future__ import annotations

import typing
from typing import Any

EXPECTED = {float: "a float", int: "an integer", bool: "true or false", str: "a string"}
BOOLS = {"true": True, "false": False, "1": True, "0": False}


def coerce(value: Any, hint: Any) -> Any:
    """`value` (a YAML value or command-line text) as the type `hint` (float, int, bool, str, X | None, Any).

    Numeric text becomes a number: YAML 1.1 reads ``2e-5`` as a string. Raises ValueError saying what was expected.
    """
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        (inner,) = (a for a in args if a is not type(None))
        try:
            return coerce(value, inner)
        except ValueError:
            raise ValueError(f"{EXPECTED[inner]} or none") from None
    if hint not in EXPECTED:  # e.g. a loss hyper-parameter without a default: the loss judges the value
        return value
    if hint is str:
        if isinstance(value, str):
            return value
    elif hint is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, str | int) else ""
        if word in BOOLS:
            return BOOLS[word]
    elif isinstance(value, bool):
        pass  # True is an int to Python, not a number to a user
    elif isinstance(value, int) or (hint is float and isinstance(value, float)):
        return hint(value)
    elif isinstance(value, str):
        try:
            return hint(value.strip())
        except ValueError:
            pass
    raise ValueError(EXPECTED[hint])
