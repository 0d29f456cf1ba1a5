"""Shape properties of the classes that hold arrays (one definition for all of them)."""

from __future__ import annotations


def axis_size(array: str, axis: int, doc: str) -> property:
    """A read-only property whose value is ``getattr(self, array).shape[axis]`` (the size
    of one axis of an array field, an int), documented by ``doc``.

    Example::

        >>> import numpy as np
        >>> from attnsvm._shapes import axis_size
        >>> class Held:
        ...     d = axis_size("A", -1, "Width d of A.")
        ...     def __init__(self, A):
        ...         self.A = A
        >>> Held(np.zeros((2, 5))).d
        5
    """
    return property(lambda self: getattr(self, array).shape[axis], doc=doc)
