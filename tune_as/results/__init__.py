"""Pure results: selection, verdicts, racing, ranking and rendering (no Ray, no MLflow): runs in, answer out."""
