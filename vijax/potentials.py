"""Site potentials φ(x), x = hᵀw, and their Gaussian expectations.

A potential is the non-Gaussian factor of the target

.. math::

    p(w) \\propto \\mathcal N(w \\mid \\mu, \\Sigma) \\prod_n \\varphi_n(h_n^\\top w).

Each potential is written for a vector of sites: ``log_phi(x)`` maps an array of
projections ``x`` (shape ``(N,)``) to ``log φ_n(x_n)``, with per-site parameters
(``loc``, ``scale``, ``df``, ``counts``, ``eps``) that are scalars or arrays of shape
``(N,)`` broadcast against ``x``.

Every potential gives

- ``expected_log_phi(mu, sigma, quadrature)`` =
  :math:`\\langle \\log \\varphi(\\mu + \\sigma z)\\rangle_{z\\sim\\mathcal N(0,1)}`, the site
  term of the Gaussian KL bound — in closed form for `Gaussian`, `Laplace`,
  `Heaviside` and `Poisson`, otherwise by quadrature (the logistic sigmoid splits
  off its linear asymptote so the rule stays accurate for ``sigma`` up to 1e2);
- ``log_expected_phi(mu, sigma, quadrature)`` =
  :math:`\\log \\langle \\varphi(\\mu + \\sigma z)\\rangle`, the log predictive density;
- the flags ``log_concave`` (the G-KL bound is then jointly concave in (m, C)) and
  ``super_gaussian`` (local variational bounds exist).

Conventions: data-carrying potentials take the observation as ``loc`` (or
``counts``); `Logistic`, `Probit` and `Heaviside` act on ``y_n x_n^T w`` with the
label folded into ``h_n`` (``labels_in_projection = True``), as the GLM builders do.
"""

from __future__ import annotations

import functools
from typing import Callable, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, gammaln, log_ndtr, ndtr

from . import _checks
from .quadrature import GaussHermite

__all__ = [
    "AbstractPotential",
    "Logistic",
    "Probit",
    "StudentT",
    "Laplace",
    "Cauchy",
    "Gaussian",
    "Heaviside",
    "Poisson",
    "Custom",
]

_LOG_2PI = float(np.log(2 * np.pi))
_DEFAULT_QUADRATURE = GaussHermite()


def _safe_ratio(num, den):
    return num / jnp.where(den > 0, den, 1.0)


class AbstractPotential(eqx.Module):
    """Base class: subclasses define ``log_phi`` and may override the expectations."""

    log_concave: ClassVar[bool] = False
    super_gaussian: ClassVar[bool] = False
    labels_in_projection: ClassVar[bool] = False

    def log_phi(self, x):
        """``log φ(x)`` elementwise; ``x`` has shape ``(N,)`` (or broadcasts with the parameters)."""
        raise NotImplementedError

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        """:math:`\\langle \\log\\varphi(\\mu + \\sigma z)\\rangle_z`, shape of ``mu``."""
        return quadrature.expect(self.log_phi, mu, sigma)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        """:math:`\\log\\langle \\varphi(\\mu + \\sigma z)\\rangle_z` (log predictive density)."""
        return quadrature.log_expect_exp(self.log_phi, mu, sigma)

    def observe(self, y):
        """The same potential with observation ``y`` (used for predictive densities)."""
        raise ValueError(f"{type(self).__name__} carries no observation; labels enter through H.")

    def check_num_sites(self, num_sites: int) -> None:
        """Raise if a per-site parameter does not broadcast against ``num_sites`` sites."""
        for name, value in _array_fields(self):
            _checks.check_broadcastable(name, value, num_sites, type(self).__name__)


def _array_fields(module):
    for name in getattr(module, "__dataclass_fields__", {}):
        value = getattr(module, name)
        if isinstance(value, (jax.Array, np.ndarray, float, int)):
            yield name, value


def _param(name, value, owner, positive=False):
    arr = _checks.as_float_array(name, value, owner)
    (_checks.check_positive if positive else _checks.check_finite)(name, arr, owner)
    return arr


# ----------------------------------------------------------------------------------------------
# Binary-classification potentials (labels folded into H)


@functools.lru_cache(maxsize=None)
def _laguerre_rule(num_nodes: int):
    return np.polynomial.laguerre.laggauss(num_nodes)


def _expected_log1p_exp_neg_abs(mu, sigma, num_nodes: int = 32):
    """⟨log(1 + e^{-|x|})⟩ for x ~ N(mu, sigma²), by Gauss–Laguerre on each half line.

    Accurate when ``sigma`` is at least about 1; the integrand e^x log1p(e^-x) is smooth.
    """
    x, w = (jnp.asarray(a, jnp.result_type(mu, sigma)) for a in _laguerre_rule(num_nodes))
    # e^x log1p(e^-x) -> 1 - e^-x / 2 for large x; avoid inf * 0 in low precision.
    big = x > 30
    ratio = jnp.where(big, 1 - 0.5 * jnp.exp(-x), jnp.exp(jnp.where(big, 0.0, x)) * jnp.log1p(jnp.exp(-x)))
    dens = lambda t: jnp.exp(-0.5 * ((t - mu[..., None]) / sigma[..., None]) ** 2)
    g = (dens(x) + dens(-x)) / (sigma[..., None] * np.sqrt(2 * np.pi))
    return jnp.sum(w * ratio * g, axis=-1)


class Logistic(AbstractPotential):
    """Logistic sigmoid φ(x) = σ(x) = 1 / (1 + e^{-x}); labels are folded into H.

    The expectation splits ``log σ(x) = min(x, 0) - log(1 + e^{-|x|})``: the first
    part has a closed form, the bounded remainder is integrated by Gauss–Laguerre
    (for ``sigma >= 1.5``) where plain Gauss–Hermite would lose accuracy.
    """

    log_concave: ClassVar[bool] = True
    super_gaussian: ClassVar[bool] = True
    labels_in_projection: ClassVar[bool] = True

    def log_phi(self, x):
        return jax.nn.log_sigmoid(x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        wide = sigma >= 1.5
        small = quadrature.expect(self.log_phi, mu, jnp.where(wide, 1.0, sigma))
        s = jnp.where(wide, sigma, 1.5)
        a = mu / s
        expected_min = mu * ndtr(-a) - s * jnp.exp(-0.5 * a**2) / np.sqrt(2 * np.pi)
        large = expected_min - _expected_log1p_exp_neg_abs(mu, s)
        return jnp.where(wide, large, small)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        # ⟨σ(x)⟩ = Φ(μ/σ) + ⟨σ(x) − 1[x > 0]⟩; the odd remainder −sign(x)σ(−|x|) is integrated by
        # Gauss–Laguerre when the step sits inside a wide Gaussian, where Gauss–Hermite is inaccurate.
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        wide = (sigma >= 1.5) & (jnp.abs(mu) <= 8 * sigma)
        small = quadrature.log_expect_exp(self.log_phi, jnp.where(wide, 0.0, mu), jnp.where(wide, 1.0, sigma))
        m, s = jnp.where(wide, mu, 0.0)[..., None], jnp.where(wide, sigma, 1.5)[..., None]
        x, w = (jnp.asarray(a, jnp.result_type(mu, sigma)) for a in _laguerre_rule(32))
        dens = lambda t: jnp.exp(-0.5 * ((t - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        remainder = jnp.sum(w * jax.nn.sigmoid(x) * (dens(-x) - dens(x)), axis=-1)
        large = jnp.log(ndtr(m[..., 0] / s[..., 0]) + remainder)
        return jnp.where(wide, large, small)


class Probit(AbstractPotential):
    """Probit φ(x) = Φ(x), the standard normal CDF; labels are folded into H."""

    log_concave: ClassVar[bool] = True
    labels_in_projection: ClassVar[bool] = True

    def log_phi(self, x):
        return log_ndtr(x)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return log_ndtr(mu / jnp.sqrt(1.0 + sigma**2))


class Heaviside(AbstractPotential):
    """Noise-robust step φ(x) = ε + (1 − 2ε)·1[x > 0], label-noise rate ``eps`` in (0, ½).

    Closed form: ⟨log φ⟩ = log(1 − ε) + Φ(−μ/σ)·log(ε / (1 − ε)).
    """

    eps: jax.Array = 0.05
    labels_in_projection: ClassVar[bool] = True

    def __init__(self, eps=0.05):
        self.eps = _param("eps", eps, "Heaviside")
        _checks.check_in_open_interval("eps", self.eps, 0.0, 0.5, "Heaviside")

    def log_phi(self, x):
        return jnp.where(x > 0, jnp.log1p(-self.eps), jnp.log(self.eps))

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        p_neg = jnp.where(sigma > 0, ndtr(-_safe_ratio(mu, sigma)), (mu <= 0).astype(jnp.result_type(mu)))
        return jnp.log1p(-self.eps) + p_neg * (jnp.log(self.eps) - jnp.log1p(-self.eps))

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        p_pos = jnp.where(sigma > 0, ndtr(_safe_ratio(mu, sigma)), (mu > 0).astype(jnp.result_type(mu)))
        return jnp.log(self.eps + (1 - 2 * self.eps) * p_pos)


# ----------------------------------------------------------------------------------------------
# Observation potentials: φ(x) = p(loc | x)


class Gaussian(AbstractPotential):
    """Gaussian likelihood φ(x) = N(loc | x, scale²) (conjugate: every method is exact)."""

    loc: jax.Array
    scale: jax.Array
    log_concave: ClassVar[bool] = True
    super_gaussian: ClassVar[bool] = True

    def __init__(self, loc=0.0, scale=1.0):
        self.loc = _param("loc", loc, "Gaussian")
        self.scale = _param("scale", scale, "Gaussian", positive=True)

    def log_phi(self, x):
        return -0.5 * (_LOG_2PI + 2 * jnp.log(self.scale) + ((self.loc - x) / self.scale) ** 2)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self.log_phi(mu) - 0.5 * (sigma / self.scale) ** 2

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        var = self.scale**2 + sigma**2
        return -0.5 * (_LOG_2PI + jnp.log(var) + (self.loc - mu) ** 2 / var)

    def observe(self, y):
        return Gaussian(y, self.scale)


class Laplace(AbstractPotential):
    """Laplace φ(x) = exp(−|loc − x| / scale) / (2 scale).

    Closed form: with a = (μ − loc)/σ, ⟨|x − loc|⟩ = σ[2 N(a) + a·erf(a/√2)].
    """

    loc: jax.Array
    scale: jax.Array
    log_concave: ClassVar[bool] = True
    super_gaussian: ClassVar[bool] = True

    def __init__(self, loc=0.0, scale=1.0):
        self.loc = _param("loc", loc, "Laplace")
        self.scale = _param("scale", scale, "Laplace", positive=True)

    def log_phi(self, x):
        return -jnp.log(2 * self.scale) - jnp.abs(self.loc - x) / self.scale

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        d = mu - self.loc
        s = jnp.where(sigma > 0, sigma, 1.0)
        a = d / s
        mean_abs = s * (2 * jnp.exp(-0.5 * a**2) / np.sqrt(2 * np.pi)) + d * erf(a / np.sqrt(2))
        mean_abs = jnp.where(sigma > 0, mean_abs, jnp.abs(d))
        return -jnp.log(2 * self.scale) - mean_abs / self.scale

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        # ⟨e^{−|y−x|/b}⟩ = e^{σ²/2b²} [e^{−d/b} Φ(d/σ − σ/b) + e^{d/b} Φ(−d/σ − σ/b)], d = y − μ.
        d, b = self.loc - mu, self.scale
        s = jnp.where(sigma > 0, sigma, 1.0)
        common = 0.5 * (s / b) ** 2
        wide = jnp.logaddexp(common - d / b + log_ndtr(d / s - s / b), common + d / b + log_ndtr(-d / s - s / b))
        return -jnp.log(2 * b) + jnp.where(sigma > 0, wide, -jnp.abs(d) / b)

    def observe(self, y):
        return Laplace(y, self.scale)


@functools.lru_cache(maxsize=None)
def _composite_legendre(num_panels: int, nodes_per_panel: int):
    x, w = np.polynomial.legendre.leggauss(nodes_per_panel)
    edges = np.linspace(0.0, 1.0, num_panels + 1)
    half = 0.5 * np.diff(edges)
    nodes = (edges[:-1, None] + half[:, None] * (x[None, :] + 1)).ravel()
    return nodes, (half[:, None] * w[None, :]).ravel()


def _expected_log1p_square(a, b, quadrature: GaussHermite):
    """⟨log(1 + u²)⟩ for u ~ N(a, b²): the peaked part of the Student-t and Cauchy log densities.

    When the peak at u = 0 lies inside a wide Gaussian (b ≥ ½, |a| ≤ 8b) Gauss–Hermite cannot
    resolve it; there the identity log(1 + u²) = 2∫₀^∞ (1 − cos ut) e^{−t} dt/t gives

        ⟨log(1 + u²)⟩ = 2 ∫ (1 − cos(a eᵛ) e^{−b² e^{2v}/2}) exp(−eᵛ) dv      (t = eᵛ),

    a smooth integrand, integrated by composite Gauss–Legendre over v ∈ [−log b − 12, 4].
    """
    wide = (b >= 0.5) & (jnp.abs(a) <= 8 * b)
    b_gh = jnp.where(wide, 0.1, b)
    narrow_value = quadrature.expect(lambda u: jnp.log1p(u**2), jnp.where(wide, 0.0, a), b_gh)
    a_w, b_w = jnp.where(wide, a, 0.0), jnp.where(wide, b, 1.0)
    nodes, weights = (jnp.asarray(t, jnp.result_type(a, b)) for t in _composite_legendre(12, 16))
    lo = -jnp.log(b_w)[..., None] - 12.0
    v = lo + (4.0 - lo) * nodes
    t = jnp.exp(v)
    integrand = (1 - jnp.cos(a_w[..., None] * t) * jnp.exp(-0.5 * (b_w[..., None] * t) ** 2)) * jnp.exp(-t)
    wide_value = 2 * (4.0 - lo[..., 0]) * jnp.sum(weights * integrand, axis=-1)
    return jnp.where(wide, wide_value, narrow_value)


class StudentT(AbstractPotential):
    """Student-t likelihood φ(x) = St(loc | x, df, scale) (heavy tails; not log-concave)."""

    df: jax.Array
    loc: jax.Array
    scale: jax.Array
    super_gaussian: ClassVar[bool] = True

    def __init__(self, df=3.0, loc=0.0, scale=1.0):
        self.df = _param("df", df, "StudentT", positive=True)
        self.loc = _param("loc", loc, "StudentT")
        self.scale = _param("scale", scale, "StudentT", positive=True)

    def log_phi(self, x):
        nu = self.df
        r = (self.loc - x) / self.scale
        return self._log_normaliser() - 0.5 * (nu + 1) * jnp.log1p(r**2 / nu)

    def _log_normaliser(self):
        nu = self.df
        return gammaln(0.5 * (nu + 1)) - gammaln(0.5 * nu) - 0.5 * jnp.log(jnp.pi * nu) - jnp.log(self.scale)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        width = jnp.sqrt(self.df) * self.scale
        peak = _expected_log1p_square((mu - self.loc) / width, sigma / width, quadrature)
        return self._log_normaliser() - 0.5 * (self.df + 1) * peak

    def observe(self, y):
        return StudentT(self.df, y, self.scale)


class Cauchy(AbstractPotential):
    """Cauchy likelihood φ(x) = 1 / (π scale (1 + ((loc − x)/scale)²)) (Student-t with one dof)."""

    loc: jax.Array
    scale: jax.Array
    super_gaussian: ClassVar[bool] = True

    def __init__(self, loc=0.0, scale=1.0):
        self.loc = _param("loc", loc, "Cauchy")
        self.scale = _param("scale", scale, "Cauchy", positive=True)

    def log_phi(self, x):
        r = (self.loc - x) / self.scale
        return -jnp.log(jnp.pi * self.scale) - jnp.log1p(r**2)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        peak = _expected_log1p_square((mu - self.loc) / self.scale, sigma / self.scale, quadrature)
        return -jnp.log(jnp.pi * self.scale) - peak

    def observe(self, y):
        return Cauchy(y, self.scale)


class Poisson(AbstractPotential):
    """Poisson count likelihood with log link, φ(x) = e^{yx − e^x} / y!, ``counts`` y ≥ 0.

    Closed form: ⟨log φ⟩ = yμ − exp(μ + σ²/2) − log y!. (The expectation exceeds the
    floating-point range once μ + σ²/2 > 709 in float64, ≈ 88 in float32.)
    """

    counts: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, counts):
        self.counts = _param("counts", counts, "Poisson")
        if _checks.is_concrete(self.counts):
            c = np.asarray(self.counts)
            if np.any(c < 0) or np.any(c != np.round(c)):
                raise ValueError("Poisson: `counts` must be non-negative integers (given as numbers).")

    def log_phi(self, x):
        return self.counts * x - jnp.exp(x) - gammaln(self.counts + 1)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self.counts * mu - jnp.exp(mu + 0.5 * sigma**2) - gammaln(self.counts + 1)

    def observe(self, y):
        return Poisson(y)


class Custom(AbstractPotential):
    """Any potential from a user function ``log_phi(x)`` (elementwise, JAX-traceable).

    **Arguments:**

    - `log_phi`: maps an array of projections to ``log φ`` elementwise.
    - `expected_log_phi`: optional closed form ``(mu, sigma) -> ⟨log φ(mu + sigma z)⟩``;
      Gauss–Hermite quadrature of ``log_phi`` is used otherwise.
    - `log_concave`, `super_gaussian`: what the user knows of φ (used to choose
      solvers and to report guarantees).
    """

    fn: Callable = eqx.field(static=True)
    expectation: Callable | None = eqx.field(static=True)
    concave: bool = eqx.field(static=True)
    super_gauss: bool = eqx.field(static=True)

    def __init__(self, log_phi, expected_log_phi=None, log_concave=False, super_gaussian=False):
        if not callable(log_phi):
            raise ValueError("Custom: `log_phi` must be a callable mapping projections to log φ.")
        self.fn = log_phi
        self.expectation = expected_log_phi
        self.concave = bool(log_concave)
        self.super_gauss = bool(super_gaussian)

    @property
    def log_concave(self):  # type: ignore[override]
        return self.concave

    @property
    def super_gaussian(self):  # type: ignore[override]
        return self.super_gauss

    def log_phi(self, x):
        return self.fn(x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        if self.expectation is not None:
            return self.expectation(mu, sigma)
        return quadrature.expect(self.fn, mu, sigma)
