"""Errors a user can cause. The CLIs print them as one line and exit with code 2."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message names what was expected and what was received."""
