"""Offline datasets: every source becomes one TensorDict with TorchRL's keys."""
