"""Losses and value estimators: CBOP, behaviour cloning and fitted Q evaluation."""
