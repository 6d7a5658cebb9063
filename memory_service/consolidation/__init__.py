"""Consolidation while the model is idle: a team's recent facts, grouped by subject, summed up per group."""
