"""Model execution: models, layers, native ops and the per-step pre/post-process."""
