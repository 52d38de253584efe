"""Training: the config, the step and the loop, evaluation, checkpoints."""
