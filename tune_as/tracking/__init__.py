"""MLflow tracking: the run schema (`schema`, no MLflow import: workers read it), the client and its secrets
(`client`), and the driver-side tracker with one record per trial (`tracker`)."""
