"""One-dimensional Gaussian expectations.

Every site term of every method reduces to an expectation under a univariate
Gaussian (Barber & Bishop's reduction):

.. math::

    \\langle g(w^\\top h) \\rangle_{\\mathcal N(w \\mid m, S)}
    = \\langle g(\\mu + \\sigma z) \\rangle_{\\mathcal N(z \\mid 0, 1)},
    \\qquad \\mu = m^\\top h,\\ \\sigma^2 = h^\\top S h .

`GaussHermite` evaluates the right-hand side with an ``n``-point Gauss–Hermite
rule (exact for polynomials of degree ``2n - 1``).
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["GaussHermite", "safe_sqrt"]


@functools.lru_cache(maxsize=None)
def _probabilists_rule(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    # hermgauss integrates against exp(-x^2); rescale to the standard normal.
    x, w = np.polynomial.hermite.hermgauss(num_nodes)
    return x * np.sqrt(2.0), w / np.sqrt(np.pi)


class GaussHermite(eqx.Module):
    """Gauss–Hermite rule for :math:`\\langle f(\\mu + \\sigma z)\\rangle_{z \\sim \\mathcal N(0,1)}`.

    **Arguments:**

    - `num_nodes`: number of nodes. The default, 32, integrates smooth site
      potentials to near machine precision for ``sigma`` up to about 10, and
      keeps the kinked ones (logistic, Student-t) accurate to about 1e-4 relative
      error for ``sigma`` up to 1e2.
    """

    num_nodes: int = eqx.field(static=True, default=32)

    def __check_init__(self):
        if not (isinstance(self.num_nodes, int) and self.num_nodes >= 1):
            raise ValueError(f"GaussHermite needs a positive integer num_nodes, got {self.num_nodes!r}.")

    def rule(self, dtype) -> tuple[jax.Array, jax.Array]:
        """Nodes and weights (each shape ``(num_nodes,)``) for the standard normal."""
        z, w = _probabilists_rule(self.num_nodes)
        return jnp.asarray(z, dtype), jnp.asarray(w, dtype)

    def expect(self, fn, mu, sigma):
        """:math:`\\langle f(\\mu + \\sigma z)\\rangle` for arrays ``mu``, ``sigma`` of equal shape.

        ``fn`` maps an array shaped like ``mu`` to one of the same shape; it is
        called once per node (under `jax.vmap`), so per-site parameters inside it
        broadcast as they would for a single evaluation.
        """
        z, w = self.rule(jnp.result_type(mu, sigma))
        values = jax.vmap(lambda zk: fn(mu + sigma * zk))(z)
        return jnp.tensordot(w, values, axes=1)

    def log_expect_exp(self, log_fn, mu, sigma):
        """:math:`\\log \\langle \\exp f(\\mu + \\sigma z)\\rangle`, computed in log space."""
        z, w = self.rule(jnp.result_type(mu, sigma))
        values = jax.vmap(lambda zk: log_fn(mu + sigma * zk))(z)
        log_w = jnp.log(w).reshape((-1,) + (1,) * (values.ndim - 1))
        return jax.scipy.special.logsumexp(values + log_w, axis=0)


def safe_sqrt(x):
    """Square root whose gradient is zero (not infinite) at ``x == 0``.

    Projected variances ``s_n^2 = ||C h_n||^2`` are exactly zero for an all-zero
    row ``h_n``; a plain `jnp.sqrt` would turn the chain rule into ``0 * inf``.
    """
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)
