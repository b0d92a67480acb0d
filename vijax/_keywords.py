"""Renamed keyword arguments: the old name keeps working, with a `DeprecationWarning`."""

from __future__ import annotations

import warnings

_UNSET = object()


def renamed(old_value, old_name: str, new_value, new_name: str, owner: str, stacklevel: int = 3):
    """The value to use for ``new_name`` when a caller may still pass ``old_name``.

    ``old_value`` is None when the caller did not pass the old keyword. Passing it warns; passing it
    together with a non-default ``new_name`` is ambiguous, so the caller must give ``new_value`` its
    default for the old keyword to be accepted (the old value then wins)."""
    if old_value is None:
        return new_value
    warnings.warn(f"{owner}: `{old_name}` is deprecated; use `{new_name}` (the same meaning).",
                  DeprecationWarning, stacklevel=stacklevel)
    return old_value
