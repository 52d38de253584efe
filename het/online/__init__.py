"""Online serving of an export (``het serve-model``): an HTTP API on FastAPI, micro-batched,
observable in Prometheus' format, and kept fresh from a running training job's publications."""
