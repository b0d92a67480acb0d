"""One-dimensional Gaussian expectations, to which every site term reduces (Barber & Bishop):
⟨g(wᵀh)⟩_{N(w | m, S)} = ⟨g(μ + σz)⟩_{z ~ N(0, 1)}, μ = mᵀh, σ² = hᵀSh.

`GaussHermite` evaluates it with an ``n``-point rule (exact for polynomials of degree ``2n - 1``); `tilted_moments`
gives EP's moments of φ(x)^η N(x | m, v).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._linalg import backtrack, unit_legendre_rule

__all__ = [
    "GaussHermite", "safe_sqrt", "tilted_moments", "moments_from_log_normaliser", "elementwise_derivatives",
    "ExpectationDerivatives", "expectation_derivatives",
]
__dir__ = __all__.copy


@functools.lru_cache(maxsize=None)
def _probabilists_rule(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.hermite.hermgauss(num_nodes)  # against exp(−x²)
    return x * np.sqrt(2.0), w / np.sqrt(np.pi)


class GaussHermite(eqx.Module):
    """Gauss–Hermite rule for :math:`\\langle f(\\mu + \\sigma z)\\rangle_{z \\sim \\mathcal N(0,1)}`.

    **Arguments:**

    - `num_nodes`: number of nodes; 32 integrates smooth potentials to near machine precision up to σ ≈ 10.
    """

    num_nodes: int = eqx.field(static=True, default=32)

    def __check_init__(self):
        if not (isinstance(self.num_nodes, int) and self.num_nodes >= 1):
            raise ValueError(f"GaussHermite needs a positive integer num_nodes, got {self.num_nodes!r}.")

    def rule(self, dtype) -> tuple[jax.Array, jax.Array]:
        """Nodes and weights (each shape ``(num_nodes,)``) for the standard normal."""
        z, w = _probabilists_rule(self.num_nodes)
        return jnp.asarray(z, dtype), jnp.asarray(w, dtype)

    def _values(self, fn, mu, sigma):
        z, w = self.rule(jnp.result_type(mu, sigma))
        return w, jax.vmap(lambda zk: fn(mu + sigma * zk))(z)

    def expect(self, fn, mu, sigma):
        """⟨f(μ + σz)⟩ for ``mu``, ``sigma`` of equal shape; ``fn`` elementwise (called per node under `jax.vmap`)."""
        w, values = self._values(fn, mu, sigma)
        return jnp.tensordot(w, values, axes=1)

    def log_expect_exp(self, log_fn, mu, sigma):
        """log⟨exp f(μ + σz)⟩, in log space."""
        w, values = self._values(log_fn, mu, sigma)
        return jax.scipy.special.logsumexp(values + jnp.log(w).reshape((-1,) + (1,) * (values.ndim - 1)), axis=0)


def safe_sqrt(x):
    """Square root with gradient zero (not infinite) at 0, the projected variance of an all-zero row ``h_n``."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


# Panel edges of one window in units of its width: fine near the centre (an edge, so a kink there is never inside).
_WINDOW_EDGES = (-12.0, -8.0, -5.0, -3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0)
_NODES_PER_PANEL = 8
_MODE_ITERATIONS = 20
_MODE_TOL = 1e-6  # widths 1/√curvature: the mode only places the rule
_MODE_HALVINGS = 60


def _tilted_mode(log_density, x0, curvature_floor):
    """A local maximum of ``log_density`` (elementwise) by Newton from ``x0`` with halving, and the curvature there,
    floored at ``curvature_floor`` (the cavity precision) so that every step ascends."""
    grad = jax.grad(lambda x: jnp.sum(log_density(x)))

    def newton(k, x):
        g, h = jax.jvp(grad, (x,), (jnp.ones_like(x),))
        step = jnp.where(jnp.isfinite(g), g / jnp.maximum(-h, curvature_floor), 0.0)
        f0 = log_density(x)
        step, _, ok, _ = backtrack(lambda t: log_density(x + t), lambda t, f: f >= f0, step, _MODE_HALVINGS)
        step = jnp.where(ok, step, 0.0)
        width = 1.0 / jnp.sqrt(jnp.maximum(-h, curvature_floor))
        return k + 1, x + step, jnp.max(jnp.where(jnp.isfinite(width), jnp.abs(step) / width, 0.0), initial=0.0)

    far = lambda state: (state[0] < _MODE_ITERATIONS) & (state[2] > _MODE_TOL)
    _, x, _ = jax.lax.while_loop(far, lambda state: newton(*state[:2]), (0, x0, jnp.asarray(jnp.inf, x0.dtype)))
    _, h = jax.jvp(grad, (x,), (jnp.ones_like(x),))
    return x, jnp.maximum(-h, curvature_floor)


def tilted_moments(potential, mean, var, power=1.0):
    """log Ẑ, mean and variance of the tilted density p̂(x) ∝ φ(x)^η N(x | mean, var), by quadrature.

    Composite Gauss–Legendre (8 nodes a panel, in log space) on the union of windows with panels at
    ``centre + width · (0, ±½, ±1, ±2, ±3, ±5, ±8, ±12)``: the cavity, the tilted mode with its Laplace width, and
    the potential's peaks or kinks (``potential._peaks()``). The rule is placed at constants, so derivatives are the
    same rule applied to the integrand's derivative. Arrays broadcast elementwise.
    """
    mean, var = jnp.broadcast_arrays(mean, var)
    dtype = jnp.result_type(mean, var)
    var = jnp.where(var > 0, var, 1.0)  # invalid cavities give garbage; callers mask them
    log_density = lambda phi, m, v: lambda x: power * phi.log_phi(x) - 0.5 * (x - m) ** 2 / v
    fixed = jax.lax.stop_gradient((potential, mean, var))
    mode, curvature = _tilted_mode(log_density(*fixed), fixed[1], 1.0 / fixed[2])
    windows = [(fixed[1], jnp.sqrt(fixed[2])), (mode, jnp.sqrt(1.0 / curvature)), *fixed[0]._peaks()]
    per_site = lambda a: jnp.broadcast_to(a, mean.shape).astype(dtype)[..., None]
    offsets = jnp.asarray(_WINDOW_EDGES, dtype)
    edges = jnp.sort(jnp.concatenate([per_site(c) + per_site(w) * offsets for c, w in windows], axis=-1), axis=-1)
    left, length = edges[..., :-1, None], jnp.diff(edges, axis=-1)[..., None]
    u, w = (jnp.asarray(a, dtype) for a in unit_legendre_rule(_NODES_PER_PANEL))
    x = (left + length * u).reshape(mean.shape + (-1,))  # (..., panels · nodes)
    nonempty = length > 0  # repeated edges give empty panels: weight 0, and no 0 · ∞ in gradients
    log_weights = jnp.where(nonempty, jnp.log(jnp.where(nonempty, length, 1.0) * w), -jnp.inf)
    # Nodes on the leading axis, so per-site parameters of shape (N,) broadcast against them.
    log_phi = jnp.moveaxis(potential.log_phi(jnp.moveaxis(x, -1, 0)), 0, -1)
    log_integrand = power * log_phi - 0.5 * (x - mean[..., None]) ** 2 / var[..., None]
    terms = log_integrand + log_weights.reshape(mean.shape + (-1,))
    log_total = jax.scipy.special.logsumexp(terms, axis=-1)
    p = jnp.exp(terms - log_total[..., None])
    tilted_mean = jnp.sum(p * x, axis=-1)
    tilted_var = jnp.sum(p * (x - tilted_mean[..., None]) ** 2, axis=-1)
    return log_total - 0.5 * jnp.log(2 * jnp.pi * var), tilted_mean, tilted_var


def elementwise_derivatives(fn, x):
    """``(f, f', f'')`` at ``x`` of an elementwise ``fn`` (output n depends on x_n only), forward over forward."""
    ones = jnp.ones_like(x)
    first = lambda x: jax.jvp(fn, (x,), (ones,))
    (value, d1), (_, d2) = jax.jvp(first, (x,), (ones,))
    return value, d1, d2


class ExpectationDerivatives(NamedTuple):
    """F(μ, v) = ⟨f(x)⟩ under N(μ, v) and its derivatives, elementwise (each shaped like μ)."""

    value: jax.Array  # F
    mean: jax.Array  # ∂F/∂μ
    var: jax.Array  # ∂F/∂v
    mean_var: jax.Array  # ∂²F/∂μ∂v
    var_var: jax.Array  # ∂²F/∂v²


def expectation_derivatives(fn, mean, var) -> ExpectationDerivatives:
    """`ExpectationDerivatives` of an elementwise ``fn(mean, var)``, forward over forward (inner along v)."""
    ones, zeros = jnp.ones_like(mean), jnp.zeros_like(mean)
    inner = lambda mu, v: jax.jvp(lambda v: fn(mu, v), (v,), (ones,))  # (F, ∂F/∂v)
    outer = lambda t_mu, t_var: jax.jvp(inner, (mean, var), (t_mu, t_var))
    (value, d_var), (d_first, d_second) = jax.vmap(outer)(jnp.stack([ones, zeros]), jnp.stack([zeros, ones]))
    # Along μ: (∂F/∂μ, ∂²F/∂v∂μ); along v: (∂F/∂v, ∂²F/∂v²).
    return ExpectationDerivatives(value[0], d_first[0], d_var[0], d_second[0], d_second[1])


def moments_from_log_normaliser(log_z_fn, mean, var):
    """Tilted moments from an elementwise log Ẑ(mean): E[x] = m + v ∂log Ẑ/∂m, Var[x] = v + v² ∂²log Ẑ/∂m²."""

    log_z, g, h = elementwise_derivatives(log_z_fn, mean)
    return log_z, mean + var * g, var + var**2 * h
