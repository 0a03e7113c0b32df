"""Counting the host synchronisations of a block of torch code (tests and benchmarks).

Here, beside the speed benchmarks, rather than in the package: nothing the package runs
counts them. The tests import it as the benchmarks do (``benchmarks.speed.host_syncs``).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncCounter(TorchDispatchMode):
    """Counts the operations that make the host wait for the device, while active.

    Counted: ``aten._local_scalar_dense`` (``.item()``, ``bool()``/``float()``/
    ``int()`` of a tensor, ``if tensor:``), copies from a non-CPU device to the
    CPU (``.cpu()``, ``.tolist()``, ``.to("cpu")``) and ops whose output shape
    depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``).
    On a CPU-only machine nothing waits, but the same Python code makes the
    same calls, so counting them on CPU tells how often a GPU run would stall.

    Example::

        with HostSyncCounter() as counter:
            update(batch)
        counter.count, counter.by_op  # total and {op name: count}
    """

    _DATA_DEPENDENT = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique")

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, int] = {}

    @property
    def count(self) -> int:
        return sum(self.by_op.values())

    def _add(self, name: str) -> None:
        self.by_op[name] = self.by_op.get(name, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func.name()
        if name == "aten::_local_scalar_dense" or name.startswith(self._DATA_DEPENDENT):
            self._add(name)
        elif name in ("aten::_to_copy", "aten::copy_") and args:
            source = args[1] if name == "aten::copy_" else args[0]
            target = args[0].device if name == "aten::copy_" else kwargs.get("device")
            if (
                isinstance(source, torch.Tensor)
                and source.device.type != "cpu"
                and target is not None
                and torch.device(target).type == "cpu"
            ):
                self._add(f"{name} (device to host)")
        elif name == "aten::index.Tensor" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())
        ):
            self._add("aten::index.Tensor (boolean mask)")
        return func(*args, **kwargs)
