"""Errors a user can cause. The CLIs print them as one line and exit with code 2."""

from __future__ import annotations

import re


class UserError(ValueError):
    """Bad input: the message names what was expected and what was received. Always one line: messages
    quoted from libraries (YAML, MLflow, Ray) are folded so the CLI's `error: ...` stays a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message)).strip())
