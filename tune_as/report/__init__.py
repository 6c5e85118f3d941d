"""`python -m tune_as.report`: MLflow runs -> the paper's tables and figures (`cli`, `tables`, `figures`)."""
