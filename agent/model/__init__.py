"""Flywheel's own policy model: a mixture-of-experts transformer, its
tokenizer, checkpoints, training and the generation engine."""
