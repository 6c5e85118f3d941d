"""The shipped search spaces (YAML, one per task), installed as the package data of tune_as.search_spaces.

This folder stays at the top of the repository (the layout users know); pyproject.toml maps it into the package,
so a wheel carries it and tune_as.space.search_space finds it through importlib. The format: docs/search_spaces.md.
"""
