"""Pure results: selection, the noise model, verdicts, racing, ranking and rendering (no Ray, no MLflow): runs
in, answer out."""
