"""The accelerated class of an eager object's class, for :func:`~cbop_torchrl.accel.accelerate`.

``accelerate`` turns an eager estimator or loss into its accelerated form in place by
giving it the class that adds the fast paths (as ``torch.nn.utils.parametrize`` gives a
parametrized module its own subclass): its parameters, buffers, ``state_dict`` keys and
references stay what they are. An eager class's accelerated class is the package's own
(``accel.CBOPLoss`` for ``objectives.CBOPLoss``); a subclass of it gets a subclass made
once, the fast paths' mixin before it.
"""

from __future__ import annotations

_MADE: dict[tuple[type, type], type] = {}


def fast_class(cls: type, mixin: type, eager_base: type, fast_base: type) -> type:
    """The class of an object of class ``cls`` with ``mixin``'s fast paths.

    Args:
        cls: the object's class (``eager_base`` or a subclass of it).
        mixin: the fast paths' mixin (already among ``cls``'s bases: ``cls`` itself).
        eager_base: the eager class.
        fast_base: its accelerated form, ``class fast_base(mixin, eager_base)``.
    """
    if issubclass(cls, mixin):
        return cls
    if not issubclass(cls, eager_base):
        raise TypeError(f"{cls.__name__} is not a {eager_base.__name__}.")
    if cls is eager_base:
        return fast_base
    key = (cls, mixin)
    if key not in _MADE:
        _MADE[key] = type(cls.__name__, (mixin, cls), {"__module__": cls.__module__})
    return _MADE[key]


__all__ = ["fast_class"]
