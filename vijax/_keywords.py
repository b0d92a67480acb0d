"""Renamed keyword arguments: the old name keeps working, with a `DeprecationWarning`."""

from __future__ import annotations

import sys
import warnings

_UNSET = object()


def renamed(owner: str, old: str, new: str, old_value, new_value, default=_UNSET):
    """The value of a keyword renamed from ``old`` to ``new``.

    ``old_value`` is None when the caller did not pass the old keyword; then ``new_value`` is used.
    Otherwise ``old_value``, with a `DeprecationWarning` attributed to the user's line; a `ValueError`
    when ``new`` was also given (differs from its ``default``) with another value."""
    if old_value is None:
        return new_value
    warnings.warn(f"{owner}: the keyword `{old}` is deprecated; use `{new}={old_value!r}`.", DeprecationWarning,
                  stacklevel=_user_stacklevel())
    if default is not _UNSET and new_value != default and new_value != old_value:
        raise ValueError(f"{owner}: got both `{old}={old_value!r}` and `{new}={new_value!r}`; pass only `{new}`.")
    return old_value


def _user_stacklevel() -> int:
    """For a `warnings.warn` in the function calling this one: the stack level of the first caller outside
    vijax and equinox (whose metaclass stands between a user and a module's ``__init__``)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("vijax", "equinox"):
        frame, level = frame.f_back, level + 1
    return level
