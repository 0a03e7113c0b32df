"""Policy evaluation on vectorized TorchRL environments and result analyses."""
