"""Pure results: selection, verdicts, racing, ranking (no Ray, no MLflow)."""
