"""Data: generators and readers that produce keys (and, later, whole batches)."""
