"""A fit's log Z as it computed it, differentiable as the function of the model it equals.

At an optimum log Z's derivative is that with the fitted parameters frozen (envelope theorem).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

__all__ = ["computed"]


@eqx.filter_custom_jvp
def computed(value, fn, *args):
    """``value``, equal to ``fn(*args)``, with the derivatives of ``fn`` in ``args``."""
    return value


@computed.def_jvp
def _computed_jvp(primals, tangents):
    value, fn, *args = primals
    _, _, *t_args = tangents
    if all(t is None for t in t_args):
        return value, jnp.zeros_like(value)
    _, t_out = eqx.filter_jvp(lambda *a: fn(*a), tuple(args), tuple(t_args))
    return value, t_out
