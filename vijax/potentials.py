"""Site potentials φ(x), x = hᵀw: the non-Gaussian factors of p(w) ∝ N(w | μ, Σ) ∏_n φ_n(h_nᵀw).

``log_phi(x)`` maps projections ``x`` ``(N,)`` to ``log φ_n(x_n)``; per-site parameters are scalars or ``(N,)``
arrays of one floating dtype. Each potential gives ``expected_log_phi`` = ⟨log φ(μ + σz)⟩ (the G-KL site term,
accurate for σ up to 1e2), ``log_expected_phi`` = log⟨φ(μ + σz)⟩ (the log predictive density), ``tilted_moments``
(EP) and the flags ``log_concave``, ``concave_expectation`` and ``super_gaussian``. Observation potentials take
the observation as ``loc`` (or ``counts``); `Logistic`, `Probit` and `Heaviside` act on y_n x_nᵀw, the label folded
into ``h_n`` (``labels_in_projection``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, gammaln, log_ndtr, ndtr

from . import _checks, _piecewise
from ._linalg import LOG_2PI, normal_log_density, unit_legendre_rule
from .quadrature import (ExpectationDerivatives, GaussHermite, expectation_derivatives, moments_from_log_normaliser,
                         safe_sqrt, tilted_moments)

__all__ = [
    "AbstractPotential",
    "Logistic",
    "PiecewiseLogistic",
    "Probit",
    "StudentT",
    "Laplace",
    "Cauchy",
    "Gaussian",
    "Heaviside",
    "Poisson",
    "Custom",
    "Masked",
]
__dir__ = __all__.copy

# Python floats (weakly typed), so that float32 inputs stay float32 when x64 is enabled.
_SQRT_2PI = float(np.sqrt(2 * np.pi))
_WIDE_LOG_SIGMOID = 1.5  # σ from which ⟨log σ(x)⟩ splits off min(x, 0) and integrates the rest by Gauss–Laguerre
_WIDE_SIGMOID = 1.5  # σ from which ⟨σ(x)⟩ is computed by Gauss–Laguerre, not Gauss–Hermite
_LAGUERRE_NODES = 48
_TILTED_RULE = GaussHermite(64)  # EP's moments need ⟨σ(x)⟩ to ~1e-11 up to σ = 1.5
_SQRT_2 = float(np.sqrt(2))
_DEFAULT_QUADRATURE = GaussHermite()


class AbstractPotential(eqx.Module):
    """Base class: subclasses define ``log_phi`` and may override the expectations."""

    log_concave: ClassVar[bool] = False
    super_gaussian: ClassVar[bool] = False
    labels_in_projection: ClassVar[bool] = False

    @property
    def concave_expectation(self) -> bool:
        """Whether ⟨log φ(μ + σz)⟩ is jointly concave in (μ, σ) (the G-KL bound then is); implied by ``log_concave``."""
        return bool(self.log_concave)

    @abc.abstractmethod
    def log_phi(self, x):
        """``log φ(x)`` elementwise; ``x`` has shape ``(N,)`` (or broadcasts with the parameters)."""

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        """:math:`\\langle \\log\\varphi(\\mu + \\sigma z)\\rangle_z`, shape of ``mu``."""
        return quadrature.expect(self.log_phi, mu, sigma)

    def expected_log_phi_derivatives(self, mu, var, quadrature: GaussHermite = _DEFAULT_QUADRATURE
                                     ) -> ExpectationDerivatives:
        """F = ⟨log φ(x)⟩, x ~ N(``mu``, ``var``), and ∂F/∂μ, ∂F/∂v, ∂²F/∂μ∂v, ∂²F/∂v², elementwise (forward mode)."""
        return expectation_derivatives(lambda m, v: self.expected_log_phi(m, safe_sqrt(v), quadrature), mu, var)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        """:math:`\\log\\langle \\varphi(\\mu + \\sigma z)\\rangle_z` (log predictive density)."""
        return quadrature.log_expect_exp(self.log_phi, mu, sigma)

    def tilted_moments(self, mean, var, power=1.0):
        """``(log Ẑ, E[x], Var[x])`` of p̂(x) ∝ φ(x)^η N(x | mean, var), η = ``power``, by quadrature unless in closed
        form (`vijax.quadrature.tilted_moments`)."""
        return tilted_moments(self, mean, var, power)

    def _peaks(self):
        """``(centre, width)`` pairs where φ has a peak or kink that quadrature must resolve."""
        return ()

    def observe(self, y):
        """The same potential with observation ``y`` (used for predictive densities)."""
        raise ValueError(f"{type(self).__name__} carries no observation; labels enter through H.")

    def site(self, n, num_sites: int) -> "AbstractPotential":
        """The potential of site ``n`` (may be traced) alone: ``(num_sites,)`` parameters indexed, shared ones kept."""
        take = lambda a: jnp.broadcast_to(a, (num_sites,))[n] if jnp.ndim(a) == 1 else a
        return jax.tree_util.tree_map(take, self)

    def check_num_sites(self, num_sites: int) -> None:
        """Raise if a per-site parameter does not broadcast against ``num_sites`` sites."""
        for name in self.__dataclass_fields__:
            if isinstance(value := getattr(self, name), (jax.Array, np.ndarray, float, int)):
                _checks.check_broadcastable(name, value, num_sites, type(self).__name__)

    def __repr__(self):
        """Scalar parameters by value, arrays as dtype and shape: ``StudentT(df=3.0, loc=f64[100], scale=0.1)``."""
        return f"{type(self).__name__}(" + ", ".join(
            f"{f.name}={_checks.format_param(getattr(self, f.name))}" for f in dataclasses.fields(self)) + ")"


def _param(name, value, owner, dtype, positive=False):
    """A parameter as a strongly typed ``dtype`` array (`vijax._checks.as_param`), checked finite (and positive)."""
    arr = _checks.as_param(name, value, owner, dtype)
    (_checks.check_positive if positive else _checks.check_finite)(name, arr, owner)
    return arr


@functools.lru_cache(maxsize=None)
def _laguerre_rule(num_nodes: int):
    return np.polynomial.laguerre.laggauss(num_nodes)


def _expected_log1p_exp_neg_abs(mu, sigma, num_nodes: int = 32):
    """⟨r(x)⟩ = ∫₀^∞ r(x) (N(x | μ, σ²) + N(−x | μ, σ²)) dx, r(x) = log(1 + e^{−|x|}), by Gauss–Laguerre (for σ ≳ 1)."""
    x, w = (jnp.asarray(a, jnp.result_type(mu, sigma)) for a in _laguerre_rule(num_nodes))
    big = x > 30  # e^x log1p(e^-x) -> 1 - e^-x / 2: no inf * 0 in low precision
    ratio = jnp.where(big, 1 - 0.5 * jnp.exp(-x), jnp.exp(jnp.where(big, 0.0, x)) * jnp.log1p(jnp.exp(-x)))
    s = sigma[..., None]
    density = lambda u: jnp.exp(-0.5 * u**2) / (s * _SQRT_2PI)
    return jnp.sum(w * ratio * (density((x - mu[..., None]) / s) + density((x + mu[..., None]) / s)), axis=-1)


def _expected_log1p_exp_neg_abs_derivatives(mu, sigma, num_nodes: int = 32) -> ExpectationDerivatives:
    """`_expected_log1p_exp_neg_abs` and its derivatives: ∂ᵏN/∂μᵏ = N Heₖ(u)/σᵏ, u = (x − μ)/σ, ∂/∂v = ½ ∂²/∂μ²."""
    x, w = _laguerre_rule(num_nodes)
    big = x > 30  # e^x log1p(e^-x) -> 1 - e^-x / 2
    ratio = np.where(big, 1 - 0.5 * np.exp(-x), np.exp(np.where(big, 0.0, x)) * np.log1p(np.exp(-x)))
    dtype = jnp.result_type(mu, sigma)
    inv = 1.0 / sigma

    def terms(node, weight):
        u_plus, u_minus = (node - mu) * inv, (node + mu) * inv
        plus, minus = weight * jnp.exp(-0.5 * u_plus**2), weight * jnp.exp(-0.5 * u_minus**2)
        p2, m2 = u_plus**2, u_minus**2
        return (plus + minus, plus * u_plus - minus * u_minus, plus * (p2 - 1) + minus * (m2 - 1),
                plus * u_plus * (p2 - 3) - minus * u_minus * (m2 - 3),
                plus * (p2 * (p2 - 6) + 3) + minus * (m2 * (m2 - 6) + 3))

    total = _node_sums(terms, jnp.asarray(x, dtype), jnp.asarray(w * ratio / _SQRT_2PI, dtype), mu)
    return ExpectationDerivatives(total[0] * inv, total[1] * inv**2, 0.5 * total[2] * inv**3,
                                  0.5 * total[3] * inv**4, 0.25 * total[4] * inv**5)


def _node_sums(terms, nodes, weights, like):
    """Σ_k terms(nodes[k], weights[k]) (five arrays shaped like ``like``) by a scan, without a (sites × nodes) array."""
    zeros = tuple(jnp.zeros_like(like) for _ in range(5))
    add = lambda total, node: (tuple(a + b for a, b in zip(total, terms(*node))), None)
    return jax.lax.scan(add, zeros, (nodes, weights), unroll=2)[0]


_LOG1P_SERIES = tuple(2.0 / (2 * k + 1) for k in range(17))


def _log1p_unit(e):
    """log(1 + e), 0 ≤ e ≤ 1, as 2 atanh(e/(2 + e)) by 17 series terms (3 ulps in float64), cheaper than log1p."""
    s = e / (2.0 + e)
    t = s * s
    total = _LOG1P_SERIES[-1]
    for coefficient in _LOG1P_SERIES[-2::-1]:
        total = total * t + coefficient
    return s * total


def _legendre_on(a, b, num_nodes: int):
    """Gauss–Legendre nodes and weights on [a, b] for arrays ``a``, ``b`` (along a new last axis)."""
    t, w = (jnp.asarray(v, jnp.result_type(a, b)) for v in unit_legendre_rule(num_nodes))
    a, b = a[..., None], b[..., None]
    return a + (b - a) * t, (b - a) * w


def _expected_log_ndtr_wide(mu, sigma):
    """⟨log Φ(x)⟩ for σ ≥ 1, |μ| ≤ 8σ, as −½⟨x²; x < 0⟩ + ∫₀^∞ log Φ(x) p(x) dx + ∫₀^∞ g(y) p(−y) dy, g(y) = log Φ(−y)
    + y²/2, by Gauss–Legendre on [0, 9], then in w = y/σ on [9/σ, 1] (in log w) and [1, 10 − μ/σ]; ~1e-11 relative."""
    cut = 9.0
    z0 = -mu / sigma
    pdf = lambda z: jnp.exp(-0.5 * z**2) / _SQRT_2PI
    g = lambda y: log_ndtr(-y) + 0.5 * y**2
    left_square = (mu**2 + sigma**2) * ndtr(z0) - mu * sigma * pdf(z0)
    m, s = mu[..., None], sigma[..., None]
    x, wx = _legendre_on(jnp.zeros_like(mu), jnp.full_like(mu, cut), 24)
    near = jnp.sum(wx * (log_ndtr(x) * pdf((x - m) / s) + g(x) * pdf((x + m) / s)), axis=-1) / sigma
    a = cut / sigma
    b = jnp.maximum(a, 1.0)
    u, wu = _legendre_on(jnp.log(a), jnp.log(b), 12)
    w_log = jnp.exp(u)
    middle = jnp.sum(wu * w_log * g(s * w_log) * pdf(z0[..., None] - w_log), axis=-1)
    w, ww = _legendre_on(b, b + jnp.maximum(z0, 0.0) + 10.0, 32)
    far = jnp.sum(ww * g(s * w) * pdf(z0[..., None] - w), axis=-1)
    return -0.5 * left_square + near + middle + far


class Logistic(AbstractPotential):
    """Logistic sigmoid φ(x) = σ(x) = 1 / (1 + e^{-x}); labels are folded into H.

    From ``sigma >= 1.5``, where Gauss–Hermite loses accuracy, ``log σ(x) = min(x, 0) − log(1 + e^{-|x|})`` is
    integrated as its first part in closed form and the bounded remainder by Gauss–Laguerre."""

    log_concave: ClassVar[bool] = True
    super_gaussian: ClassVar[bool] = True
    labels_in_projection: ClassVar[bool] = True

    def log_phi(self, x):
        return jax.nn.log_sigmoid(x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        wide = sigma >= _WIDE_LOG_SIGMOID
        small = quadrature.expect(self.log_phi, mu, jnp.where(wide, 1.0, sigma))
        s = jnp.where(wide, sigma, _WIDE_LOG_SIGMOID)
        a = mu / s
        expected_min = mu * ndtr(-a) - s * jnp.exp(-0.5 * a**2) / _SQRT_2PI
        large = expected_min - _expected_log1p_exp_neg_abs(mu, s)
        return jnp.where(wide, large, small)

    def expected_log_phi_derivatives(self, mu, var, quadrature: GaussHermite = _DEFAULT_QUADRATURE
                                     ) -> ExpectationDerivatives:
        """In closed form on the rules of `expected_log_phi`: ∂ᵏF/∂μᵏ = ⟨f⁽ᵏ⁾⟩ and ∂/∂v = ½ ∂²/∂μ², f = log σ(x)."""
        mu, var = jnp.broadcast_arrays(mu, var)
        sigma = safe_sqrt(var)
        wide = sigma >= _WIDE_LOG_SIGMOID
        z, w = quadrature.rule(jnp.result_type(mu, var))
        narrow_sigma = jnp.where(wide, 0.0, sigma)

        def terms(node, weight):  # f' = q, f'' = −pq, f''' = −pq(q − p), f'''' = −pq(1 − 6pq); e = e^{−|x|}
            x = mu + narrow_sigma * node
            e = jnp.exp(-jnp.abs(x))
            r = 1.0 / (1.0 + e)
            er = e * r
            p, q = jnp.where(x >= 0, r, er), jnp.where(x >= 0, er, r)  # each to full relative precision
            pq = er * r
            return tuple(weight * f for f in (jnp.minimum(x, 0.0) - _log1p_unit(e), q, pq, pq * (q - p),
                                              pq * (1 - 6 * pq)))

        total = _node_sums(terms, z, w, mu)
        narrow = ExpectationDerivatives(total[0], total[1], -0.5 * total[2], -0.5 * total[3], -0.25 * total[4])
        s = jnp.where(wide, sigma, _WIDE_LOG_SIGMOID)
        a = mu / s
        pdf = jnp.exp(-0.5 * a**2) / _SQRT_2PI
        r = _expected_log1p_exp_neg_abs_derivatives(mu, s)
        large = ExpectationDerivatives(mu * ndtr(-a) - s * pdf - r.value, ndtr(-a) - r.mean, -0.5 * pdf / s - r.var,
                                       0.5 * a * pdf / s**2 - r.mean_var, -0.25 * (a**2 - 1) * pdf / s**3 - r.var_var)
        return ExpectationDerivatives(*(jnp.where(wide, u, v) for u, v in zip(large, narrow)))

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self._log_expected_sigmoid(mu, sigma, quadrature, derivatives=False)[0]

    def tilted_moments(self, mean, var, power=1.0):
        if not (isinstance(power, (int, float)) and power == 1):
            return super().tilted_moments(mean, var, power)
        # Ẑ = ⟨σ(x)⟩ on one smooth rule; E[x] = m + v ∂log Ẑ/∂m, Var[x] = v + v² ∂²log Ẑ/∂m² on the same rule.
        mean, var = jnp.broadcast_arrays(mean, var)
        log_z, slope, curvature = self._log_expected_sigmoid(mean, jnp.sqrt(var), _TILTED_RULE, derivatives=True)

        return log_z, mean + var * slope, var + var**2 * curvature

    @staticmethod
    def _log_expected_sigmoid(mu, sigma, quadrature, derivatives):
        """log⟨σ(x)⟩ (and its first two μ-derivatives): Gauss–Hermite in log space, or from σ = 1.5 ⟨σ(x)⟩ = Φ(μ/σ) +
        ∫₀^∞ e^{−t} (N(−t | μ, σ²) − N(t | μ, σ²)) / (1 + e^{−t}) dt by Gauss–Laguerre, relative to its largest term;
        below μ = −σ²/2 reflected, ⟨σ(x)⟩_{N(μ, σ²)} = e^{μ + σ²/2} ⟨σ(x)⟩_{N(−μ − σ², σ²)}."""
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        var = sigma**2
        reflect = mu < -0.5 * var
        shift, mu = mu + 0.5 * var, jnp.where(reflect, -mu - var, mu)
        wide = sigma >= _WIDE_SIGMOID
        z, w_gh = quadrature.rule(jnp.result_type(mu, sigma))
        x = mu[..., None] + jnp.where(wide, 1.0, sigma)[..., None] * z
        log_terms = jnp.log(w_gh) + jax.nn.log_sigmoid(x)
        small = jax.scipy.special.logsumexp(log_terms, axis=-1)
        m, s = jnp.where(wide, mu, 1.0)[..., None], jnp.where(wide, sigma, 1.0)[..., None]
        t, w = (jnp.asarray(a, jnp.result_type(mu, sigma)) for a in _laguerre_rule(_LAGUERRE_NODES))
        # N(−t)·(1 − e^y) = N(−t) − N(t), y = 2tμ/σ², with each sign of μ in a form that neither overflows
        # nor has a singular derivative at μ = 0.
        y = 2.0 * t * m / s**2
        negative = m <= 0
        y_neg, y_pos = jnp.where(negative, y, 0.0), jnp.where(negative, 0.0, y)
        log_base = jnp.log(w) - jnp.log1p(jnp.exp(-t)) - 0.5 * ((t + m) / s) ** 2 - jnp.log(s * _SQRT_2PI)
        log_step = log_ndtr(m[..., 0] / s[..., 0])
        top = jnp.maximum(log_step, jnp.max(log_base + y_pos, axis=-1))
        terms = jnp.where(negative, -jnp.exp(log_base - top[..., None]) * jnp.expm1(y_neg),
                          jnp.exp(log_base + y_pos - top[..., None]) * jnp.expm1(-y_pos))  # N(−t) − N(t), scaled
        total = jnp.exp(log_step - top) + jnp.sum(terms, axis=-1)
        value = jnp.where(wide, top + jnp.log(total), small)
        value = jnp.where(reflect, shift + value, value)
        if not derivatives:
            return (value,)
        weights = jnp.exp(log_terms - small[..., None])  # π_k
        p, q = jax.nn.sigmoid(x), jax.nn.sigmoid(-x)
        slope_small = jnp.sum(weights * q, axis=-1)
        curvature_small = jnp.sum(weights * q * (q - p), axis=-1) - slope_small**2
        minus = jnp.exp(log_base - top[..., None])  # N(−t), scaled
        plus = minus - terms  # N(t), scaled
        a, s1 = m[..., 0] / s[..., 0], s[..., 0]
        density = jnp.exp(-0.5 * a**2 - jnp.log(s1 * _SQRT_2PI) - top)  # N(0 | μ, σ²) = ∂Φ(μ/σ)/∂μ, scaled
        first = density + jnp.sum(-(t * (minus + plus) + m * terms), axis=-1) / s1**2
        u2 = ((t + m) / s) ** 2
        second = -a * density / s1 + jnp.sum(terms * (u2 - 1) + 4 * t * m * plus / s**2, axis=-1) / s1**2
        slope_wide = first / total
        slope = jnp.where(wide, slope_wide, slope_small)
        curvature = jnp.where(wide, second / total - slope_wide**2, curvature_small)
        return value, jnp.where(reflect, 1.0 - slope, slope), curvature


class PiecewiseLogistic(AbstractPotential):
    """A piecewise lower bound on the logistic sigmoid: log σ(x) − ε_R ≤ log φ(x) = −f̄(−x) ≤ log σ(x).

    f̄ is the R-piece bound of `vijax.piecewise`, ε_R = ``max_error``; ⟨log φ⟩ and log⟨φ⟩ are in closed form, so
    `vj.GKL` gives a lower bound on log Z, at most N·ε_R below the exact G-KL bound (`bound_logistic_sites`).

    **Arguments:**

    - `pieces`: R, 3 … 20 (the shipped tables; default 20).
    - `kind`: ``"quadratic"`` (default; ε_20 = 1.4e-4) or ``"linear"`` (ε_20 = 3.3e-3; log-concave).
    """

    pieces: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)
    labels_in_projection: ClassVar[bool] = True

    def __init__(self, pieces=20, kind="quadratic"):
        _piecewise.check(kind, pieces, "PiecewiseLogistic")
        self.pieces = int(pieces)
        self.kind = kind

    @property
    def log_concave(self):  # type: ignore[override]
        # Quadratic: f̄ jumps at the breakpoints, so not even ⟨log φ⟩ is concave (docs/benchmarks.md).
        return self.kind == "linear"

    @property
    def max_error(self) -> float:
        """ε_R = max_x [log σ(x) − log φ(x)]."""
        return _piecewise.table(self.kind, self.pieces)[2]

    def log_phi(self, x):
        return -_piecewise.value(self.kind, self.pieces, -x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return -_piecewise.expected(self.kind, self.pieces, -mu, sigma)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return _piecewise.log_expected_exp_neg(self.kind, self.pieces, -mu, sigma)


class Probit(AbstractPotential):
    """Probit φ(x) = Φ(x), the standard normal CDF; labels are folded into H."""

    log_concave: ClassVar[bool] = True
    labels_in_projection: ClassVar[bool] = True

    def log_phi(self, x):
        return log_ndtr(x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        # Gauss–Hermite is inaccurate once the bend of log Φ near 0 lies inside a wide Gaussian: split rule there.
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        wide = (sigma >= 1.0) & (jnp.abs(mu) <= 8 * sigma)
        small = quadrature.expect(self.log_phi, jnp.where(wide, 0.0, mu), jnp.where(wide, 1.0, sigma))
        # The split rule costs several plain rules per point: skip it when no point needs it.
        large = jax.lax.cond(jnp.any(wide),
                             lambda: _expected_log_ndtr_wide(jnp.where(wide, mu, 0.0), jnp.where(wide, sigma, 1.0)),
                             lambda: jnp.zeros_like(small))
        return jnp.where(wide, large, small)

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return log_ndtr(mu / jnp.sqrt(1.0 + sigma**2))

    def tilted_moments(self, mean, var, power=1.0):
        if not (isinstance(power, (int, float)) and power == 1):
            return super().tilted_moments(mean, var, power)
        # Ẑ = Φ(z), z = m/√(1+v); ρ = N(z)/Φ(z) in log space, stable far in the lower tail.
        s = jnp.sqrt(1.0 + var)
        z = mean / s
        log_z = log_ndtr(z)
        rho = jnp.where(z > -10, jnp.exp(-0.5 * z**2 - 0.5 * LOG_2PI - log_z), _inverse_mills(-z))
        return log_z, mean + var * rho / s, var - var**2 * rho * (z + rho) / s**2


def _inverse_mills(t, terms=40):
    """N(t)/Φ(−t) for t ≥ 10 by the continued fraction Φ(−t)/N(t) = 1/(t + 1/(t + 2/(t + ⋯))): `log_ndtr` has
    ~4e-9 accuracy below −20, and ρ(z + ρ) in the tilted variance cancels to ~1/z²."""
    t = jnp.maximum(t, 10.0)
    tail = t
    for k in range(terms, 0, -1):
        tail = t + k / tail
    return tail


class Heaviside(AbstractPotential):
    """Noise-robust step φ(x) = ε + (1 − 2ε)·1[x > 0], label-noise rate ``eps`` in (0, ½) (default 0.05)."""

    eps: jax.Array
    labels_in_projection: ClassVar[bool] = True

    def __init__(self, eps=0.05):
        self.eps = _param("eps", eps, "Heaviside", _checks.float_dtype(eps))
        _checks.check_in_open_interval("eps", self.eps, 0.0, 0.5, "Heaviside")

    def log_phi(self, x):
        return jnp.where(x > 0, jnp.log1p(-self.eps), jnp.log(self.eps))

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        positive = sigma > 0
        p_neg = jnp.where(positive, ndtr(-mu / jnp.where(positive, sigma, 1.0)), (mu <= 0).astype(jnp.result_type(mu)))
        return jnp.log1p(-self.eps) + p_neg * (jnp.log(self.eps) - jnp.log1p(-self.eps))

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        positive = sigma > 0
        p_pos = jnp.where(positive, ndtr(mu / jnp.where(positive, sigma, 1.0)), (mu > 0).astype(jnp.result_type(mu)))
        return jnp.log(self.eps + (1 - 2 * self.eps) * p_pos)

    def tilted_moments(self, mean, var, power=1.0):
        # φ^η = ε^η + ((1 − ε)^η − ε^η)·1[x > 0], so Ẑ = ε^η + ((1 − ε)^η − ε^η) Φ(m/√v).
        low = power * jnp.log(self.eps)
        step = jnp.log(jnp.exp(power * jnp.log1p(-self.eps)) - jnp.exp(low))
        log_z = lambda m: jnp.logaddexp(low, step + log_ndtr(m / jnp.sqrt(var)))
        return moments_from_log_normaliser(log_z, mean, var)


class _LocationScale(AbstractPotential):
    """A likelihood of an observation ``loc`` with a positive ``scale``, peaked at ``loc`` (super-Gaussian)."""

    loc: jax.Array
    scale: jax.Array
    super_gaussian: ClassVar[bool] = True

    def __init__(self, loc=0.0, scale=1.0):
        dtype = _checks.float_dtype(loc, scale)
        self.loc = _param("loc", loc, type(self).__name__, dtype)
        self.scale = _param("scale", scale, type(self).__name__, dtype, positive=True)

    def _peaks(self):
        return ((self.loc, self.scale),)

    def observe(self, y):
        return dataclasses.replace(self, loc=y)


class Gaussian(_LocationScale):
    """Gaussian likelihood φ(x) = N(loc | x, scale²) (conjugate: every method is exact)."""

    log_concave: ClassVar[bool] = True

    def _peaks(self):
        return ()  # smooth, and every expectation is in closed form

    def log_phi(self, x):
        return normal_log_density(self.loc, x, self.scale**2)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self.log_phi(mu) - 0.5 * (sigma / self.scale) ** 2

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return normal_log_density(self.loc, mu, self.scale**2 + sigma**2)

    def tilted_moments(self, mean, var, power=1.0):
        # φ^η = (2πs²)^{(1−η)/2} η^{−1/2} N(loc | x, s²/η): a Gaussian again.
        s2 = self.scale**2 / power
        total = var + s2
        log_z = 0.5 * (1 - power) * jnp.log(2 * jnp.pi * self.scale**2) - 0.5 * jnp.log(power) \
            + normal_log_density(self.loc, mean, total)
        return log_z, mean + var * (self.loc - mean) / total, var * s2 / total


@jax.custom_jvp
def _mean_abs(d, sigma):
    """⟨|d + σz|⟩ = 2σN(a) + d·erf(a/√2), a = d/σ (|d| at σ = 0), with the closed-form JVP."""
    positive = sigma > 0
    s = jnp.where(positive, sigma, 1.0)
    a = d / s
    return jnp.where(positive, s * (2 * jnp.exp(-0.5 * a**2) / _SQRT_2PI) + d * erf(a / _SQRT_2), jnp.abs(d))


@_mean_abs.defjvp
def _mean_abs_jvp(primals, tangents):
    d, sigma = primals
    dd, dsigma = tangents
    positive = sigma > 0
    a = d / jnp.where(positive, sigma, 1.0)
    slope_d = jnp.where(positive, erf(a / _SQRT_2), jnp.sign(d))
    slope_sigma = jnp.where(positive, 2 * jnp.exp(-0.5 * a**2) / _SQRT_2PI, 0.0)
    return _mean_abs(d, sigma), slope_d * dd + slope_sigma * dsigma


class Laplace(_LocationScale):
    """Laplace φ(x) = exp(−|loc − x| / scale) / (2 scale); ⟨log φ⟩ and log⟨φ⟩ in closed form."""

    log_concave: ClassVar[bool] = True

    def log_phi(self, x):
        return -jnp.log(2 * self.scale) - jnp.abs(self.loc - x) / self.scale

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        d, sigma = jnp.broadcast_arrays(mu - self.loc, sigma)
        return -jnp.log(2 * self.scale) - _mean_abs(d, sigma) / self.scale

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        # ⟨e^{−|y−x|/b}⟩ = e^{σ²/2b²} [e^{−d/b} Φ(d/σ − σ/b) + e^{d/b} Φ(−d/σ − σ/b)], d = y − μ.
        d, b = self.loc - mu, self.scale
        s = jnp.where(sigma > 0, sigma, 1.0)
        common = 0.5 * (s / b) ** 2
        wide = jnp.logaddexp(common - d / b + log_ndtr(d / s - s / b), common + d / b + log_ndtr(-d / s - s / b))
        return -jnp.log(2 * b) + jnp.where(sigma > 0, wide, -jnp.abs(d) / b)

    # Tilted moments by quadrature: the closed-form log Ẑ loses digits in ∂² once the cavity is much wider than scale.


# Panels in v = log t of the integral below, relative to −log b (short where cos(a t) e^{−(b t)²/2} turns), then fixed.
_FOURIER_EDGES_REL = (-14.0, -7.0, -2.0, 0.0, 0.8, 1.4, 2.0, 2.6)
_FOURIER_EDGES_ABS = (0.0, 2.0, 4.0)


def _expected_log1p_square(a, b, quadrature: GaussHermite):
    """⟨log(1 + u²)⟩, u ~ N(a, b²); for b ≥ ½, |a| ≤ 8b as 2∫ (1 − cos(a eᵛ) e^{−b² e^{2v}/2}) exp(−eᵛ) dv by
    Gauss–Legendre on ``_FOURIER_EDGES_*`` (the part below in closed form), ≲ 1e-13 relative."""
    wide = (b >= 0.5) & (jnp.abs(a) <= 8 * b)
    b_gh = jnp.where(wide, 0.1, b)
    narrow_value = quadrature.expect(lambda u: jnp.log1p(u**2), jnp.where(wide, 0.0, a), b_gh)
    a_w, b_w = jnp.where(wide, a, 0.0), jnp.where(wide, b, 1.0)
    c = -jnp.log(b_w)
    edges = [c + offset for offset in _FOURIER_EDGES_REL]
    edges += [jnp.maximum(edges[-1], edge) for edge in _FOURIER_EDGES_ABS]
    v, dv = _legendre_on(jnp.stack(edges[:-1], axis=-1), jnp.stack(edges[1:], axis=-1), 16)
    t = jnp.exp(v)
    a_, b_ = a_w[..., None, None], b_w[..., None, None]
    integrand = (1 - jnp.cos(a_ * t) * jnp.exp(-0.5 * (b_ * t) ** 2)) * jnp.exp(-t)
    below = 0.25 * (a_w**2 + b_w**2) * jnp.exp(2 * edges[0])
    wide_value = 2 * (jnp.sum(dv * integrand, axis=(-2, -1)) + below)
    return jnp.where(wide, wide_value, narrow_value)


class StudentT(AbstractPotential):
    """Student-t likelihood φ(x) = St(loc | x, df, scale) (heavy tails; not log-concave)."""

    df: jax.Array
    loc: jax.Array
    scale: jax.Array
    super_gaussian: ClassVar[bool] = True

    def __init__(self, df=3.0, loc=0.0, scale=1.0):
        dtype = _checks.float_dtype(df, loc, scale)
        self.df = _param("df", df, "StudentT", dtype, positive=True)
        self.loc = _param("loc", loc, "StudentT", dtype)
        self.scale = _param("scale", scale, "StudentT", dtype, positive=True)

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

    _peaks = _LocationScale._peaks
    observe = _LocationScale.observe


class Cauchy(_LocationScale):
    """Cauchy likelihood φ(x) = 1 / (π scale (1 + ((loc − x)/scale)²)) (Student-t with one dof)."""

    def log_phi(self, x):
        r = (self.loc - x) / self.scale
        return -jnp.log(jnp.pi * self.scale) - jnp.log1p(r**2)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        mu, sigma = jnp.broadcast_arrays(mu, sigma)
        peak = _expected_log1p_square((mu - self.loc) / self.scale, sigma / self.scale, quadrature)
        return -jnp.log(jnp.pi * self.scale) - peak


class Poisson(AbstractPotential):
    """Poisson count likelihood with log link, φ(x) = e^{yx − e^x} / y!, ``counts`` y ≥ 0.

    ⟨log φ⟩ = yμ − exp(μ + σ²/2) − log y! overflows once μ + σ²/2 > 709 in float64 (≈ 88 in float32)."""

    counts: jax.Array
    log_concave: ClassVar[bool] = True

    def __init__(self, counts):
        self.counts = _param("counts", counts, "Poisson", _checks.float_dtype(counts))
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
    - `expected_log_phi`: optional closed form ``(mu, sigma) -> ⟨log φ(mu + sigma z)⟩`` (default: Gauss–Hermite).
    - `log_concave`, `super_gaussian`: what is known of φ (default False; chooses solvers, reports guarantees).
    """

    # The callables' arrays (e.g. of a bound method) are leaves, so that their parameters are traced, not frozen.
    arrays: tuple
    functions: tuple = eqx.field(static=True)
    log_concave: bool = eqx.field(static=True)  # type: ignore[assignment]
    super_gaussian: bool = eqx.field(static=True)  # type: ignore[assignment]

    def __init__(self, log_phi, expected_log_phi=None, log_concave=False, super_gaussian=False):
        if not callable(log_phi):
            raise ValueError("Custom: `log_phi` must be a callable mapping projections to log φ.")
        if expected_log_phi is not None and not callable(expected_log_phi):
            raise ValueError("Custom: `expected_log_phi` must be None or a callable (mu, sigma) -> ⟨log φ⟩.")
        self.arrays, self.functions = eqx.partition((log_phi, expected_log_phi), eqx.is_array)
        self.log_concave = bool(log_concave)
        self.super_gaussian = bool(super_gaussian)

    def __repr__(self):
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"Custom(log_phi={name}, log_concave={self.log_concave}, super_gaussian={self.super_gaussian})"

    @property
    def fn(self):
        return eqx.combine(self.arrays, self.functions)[0]

    @property
    def expectation(self):
        return eqx.combine(self.arrays, self.functions)[1]

    def log_phi(self, x):
        return self.fn(x)

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        if self.expectation is not None:
            return self.expectation(mu, sigma)
        return quadrature.expect(self.fn, mu, sigma)


class Masked(AbstractPotential):
    """``potential`` on the sites where ``mask`` is True, and φ ≡ 1 on the others.

    A masked-out site changes neither Z nor the posterior. Keep ``potential``'s parameters valid there (as
    `vijax.pad_sites` does): a non-finite value under `jnp.where` still reaches reverse-mode derivatives.


    **Arguments:**

    - `potential`: the potential of the sites that are on (any `AbstractPotential`).
    - `mask`: booleans, shape ``(N,)`` (or a scalar); True keeps a site.
    """

    potential: AbstractPotential
    mask: jax.Array

    def __init__(self, potential, mask):
        if not isinstance(potential, AbstractPotential):
            raise ValueError(f"Masked: `potential` must be a vj.potentials potential, got {type(potential).__name__}.")
        mask = jnp.asarray(mask)
        if mask.ndim > 1:
            raise ValueError(f"Masked: `mask` must be a scalar or have one entry per site, got shape {mask.shape}.")
        if not jnp.issubdtype(mask.dtype, jnp.bool_):
            if _checks.is_concrete(mask) and not np.all(np.isin(np.asarray(mask), (0, 1))):
                raise ValueError("Masked: `mask` must hold booleans (or 0 and 1).")
            mask = mask != 0
        self.potential = potential
        self.mask = mask

    # log φ̃ is log φ or 0: every flag is the wrapped potential's.
    log_concave = property(lambda self: self.potential.log_concave)  # type: ignore[assignment]
    concave_expectation = property(lambda self: self.potential.concave_expectation)  # type: ignore[assignment]
    super_gaussian = property(lambda self: self.potential.super_gaussian)  # type: ignore[assignment]
    labels_in_projection = property(lambda self: self.potential.labels_in_projection)  # type: ignore[assignment]


    def _select(self, on, off=0.0):
        return jnp.where(self.mask, on, off)

    def log_phi(self, x):
        return self._select(self.potential.log_phi(x))

    def expected_log_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self._select(self.potential.expected_log_phi(mu, sigma, quadrature))

    def expected_log_phi_derivatives(self, mu, var, quadrature: GaussHermite = _DEFAULT_QUADRATURE
                                     ) -> ExpectationDerivatives:
        d = self.potential.expected_log_phi_derivatives(mu, var, quadrature)
        return ExpectationDerivatives(*(self._select(x) for x in d))

    def log_expected_phi(self, mu, sigma, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
        return self._select(self.potential.log_expected_phi(mu, sigma, quadrature))

    def tilted_moments(self, mean, var, power=1.0):
        log_z, tilted_mean, tilted_var = self.potential.tilted_moments(mean, var, power)
        mean, var = jnp.broadcast_arrays(mean, var)
        return self._select(log_z), self._select(tilted_mean, mean), self._select(tilted_var, var)

    def _peaks(self):
        return self.potential._peaks()

    def observe(self, y):
        """The unmasked potential with observation ``y`` (new data: every site on)."""
        return self.potential.observe(y)

    def check_num_sites(self, num_sites: int) -> None:
        _checks.check_broadcastable("mask", self.mask, num_sites, "Masked")
        self.potential.check_num_sites(num_sites)
