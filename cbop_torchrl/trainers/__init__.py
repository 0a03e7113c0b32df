"""The offline trainer: dynamics -> BC -> FQE -> CBOP, with checkpoints and logging."""
