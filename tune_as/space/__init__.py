"""Search spaces: reading `search_spaces/<task>.yaml` strictly, typing values once, Optuna distributions."""
