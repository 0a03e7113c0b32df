"""Networks: vectorized ensembles, the dynamics model, the actor and the Q-ensemble."""
