"""Above the trainers: offline policy selection, run analyses and the report.

The plain policy evaluator the trainers use lives below them, in :mod:`cbop_torchrl.envs`.
"""
