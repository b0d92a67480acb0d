"""Renamed keyword arguments: the old name keeps working, with a `DeprecationWarning`."""

from __future__ import annotations

import warnings


def renamed(old_value, old_name: str, new_value, new_name: str, owner: str, stacklevel: int = 3):
    """The value to use for ``new_name`` when a caller may still pass ``old_name``.

    ``old_value`` is None when the caller did not pass the old keyword; then ``new_value`` is used.
    Otherwise a `DeprecationWarning` (attributed to the caller's caller) and ``old_value`` is used."""
    if old_value is None:
        return new_value
    warnings.warn(f"{owner}: `{old_name}` is deprecated; use `{new_name}` (the same meaning).",
                  DeprecationWarning, stacklevel=stacklevel)
    return old_value
