"""Affine-independent KL (AI-KL): non-Gaussian approximations with a lower bound on log Z.

q(w) is the density of w = A v + b, where v has independent, possibly non-Gaussian coordinates
(thesis ch. 6; Challis & Barber, NIPS 2012):

$$
q_w(w) = |\\det A|^{-1} \\prod_d q_v\\big([A^{-1}(w - b)]_d \\mid \\theta_d\\big),
\\qquad A = L U,
$$

with L lower-triangular, U upper-triangular (every invertible A is L U P with P a permutation, and a
permutation of independent coordinates is absorbed into their parameters θ_d, so nothing is lost).
For the model p(w) ∝ f(w) ∏_n φ_n(h_nᵀw + c_n) the KL bound is

$$
\\log Z \\ge \\mathcal B = \\log|\\det A| + \\sum_d H[q_v(\\cdot\\mid\\theta_d)]
+ \\langle \\log f(w) \\rangle_q + \\sum_n \\langle \\log \\varphi_n(y_n) \\rangle_{q_{y_n}},
\\qquad y_n = \\alpha_n^\\top v + \\beta_n,\\ \\alpha_n = A^\\top h_n,\\ \\beta_n = h_n^\\top b + c_n
$$

(thesis eq. 6.3.1). The Gaussian term depends on q only through its mean A v̄ + b and covariance
A diag(var v) Aᵀ, so it is the G-KL one, in closed form. Each site term needs the density of a sum of
D independent variables u_d = α_d v_d: every u_d is put on one lattice of K points with common
spacing Δ spanning ±ν σ_y (ν = 6, σ_y² = Σ_d α_d² var v_d) around its mean, and the D lattices are
convolved exactly by a zero-padded FFT (thesis eq. 6.3.4),

$$
\\rho = \\mathrm{ifft}\\Big[\\prod_d \\mathrm{fft}[\\pi_d, 0, \\dots, 0]\\Big],
\\qquad \\langle \\log\\varphi(y)\\rangle \\approx \\sum_j \\rho_j \\log\\varphi(\\beta + l_j).
$$

The lattice weights π_dk are the density of u_d at the lattice points, normalised to sum to one (the
cell masses by the midpoint rule). For smooth bases this is the trapezoidal rule, whose error falls
exponentially with K, where exact cell masses would add Δ²/12 to every coordinate's variance.
That holds for a coordinate wider than a few Δ; one narrower (|α_d| sd v_d ≲ Δ, common when D is
large: at D = 100 half of them at K = 64) would put its mass on one point and lose its variance, so
the bound would be overstated (by 3 nats at the G-KL optimum of a Table 6.1 problem at K = 64) and
the optimiser would steer into it. Such a coordinate enters the product of transforms by its
cumulant transform to third order instead (exact mean, variance and skewness), mixed with the
sampled one by a smooth step between widths of 1 and 2 Δ. A kink of log φ (a Laplace site) makes
the sum below an O(Δ²) error that oscillates with the kink's position between atoms; its leading
Euler–Maclaurin term is added back (`_expect`). With both, the error at the G-KL optimum of that
problem is 8·10⁻⁴ at K = 64 and 10⁻⁴ at K = 128 (from 3.0 and 1.0).
Only the discretisation is an approximation: the convolution is exact. The sum of D lattices has
D(K − 1) + 1 atoms; ``padding="full"`` transforms all of them, ``padding="window"`` (default) keeps
the 2K or more atoms nearest y's mean (at least ±12 σ_y: the cyclic convolution folds back only the
mass further out, below rounding for the light-tailed bases here, and it is exact for D ≤ 2), so the
cost per site is O(D K log K) rather than O(D² K log DK). Only the components wider than a spacing
need their densities sampled and transformed, and there are at most ((K − 1)/(2 span))² of them
whatever D (`_wide_count`: 27 at K = 64): the others enter by one exponential of their summed
cumulants, so at large D a site costs O(K² log K) plus O(D) (the same value as transforming all D).

Gradients come from autodiff through the lattice and the FFT. The fit maximises the bound jointly over
(L, U, b, θ) by L-BFGS, in coordinates relative to the Gaussian it starts from (the G-KL optimum by
default), and re-evaluates the final bound with K doubled until it changes by less than ``tol_k``;
the K used is ``post.diagnostics.info.lattice_points``.

Bases (`Normal`, `SkewNormal`, `GeneralisedNormal`, or a subclass of `AbstractBase`) are
standardised: each coordinate has mean 0 and variance 1 whatever θ_d, so θ_d changes only the shape.
"""

from __future__ import annotations

import math
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.special import gammaln, log_ndtr

from .._linalg import LOG_2PI
from ..covariance import CholeskyFactor, Full
from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..projections import as_projection
from ..solvers import LBFGS, AbstractSolver, Solution
from ._base import AbstractMethod, same_shapes
from ._envelope import computed
from .gkl import GKL, bound_at

__all__ = ["AbstractBase", "Normal", "SkewNormal", "GeneralisedNormal", "AIKLParams", "AIKLState", "AIKLInfo", "AIKLPosterior",
           "AIKL", "bound", "site_expectations", "lattice_densities"]

_SPAN = 6.0  # lattice end points at ±_SPAN σ_y (thesis §6.3.1)
_PADDINGS = ("window", "full")
_SCHEMES = ("joint", "blockwise")


def _pow_abs(x, p):
    """|x|^p with finite derivatives in x and p at x = 0 (for p > 1)."""
    a = jnp.abs(x)
    pos = a > 0
    return jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, a, 1.0))), 0.0)


# ------------------------------------------------------------------------------------------ bases


class AbstractBase(eqx.Module):
    """A family of univariate base densities q_v(v | θ) for the coordinates of v.

    A base is standardised by contract unless it overrides `mean` and `variance`: the defaults say
    ⟨v⟩ = 0 and var v = 1, so A and b alone set q's location and scale. θ is an array of shape
    ``(D,)``, one shape parameter per coordinate; `learn` says whether the fit optimises it.

    Subclasses implement `init_theta`, `log_density`, `entropy` and `sample`.
    """

    learn: eqx.AbstractVar[bool]

    def init_theta(self, dim: int, dtype) -> jax.Array:
        """θ where the fit starts, shape ``(D,)`` (the Gaussian member of the family where it has one)."""
        return jnp.zeros((dim,), dtype)

    def log_density(self, v, theta):
        """log q_v(v | θ), elementwise; ``v`` broadcasts against ``theta``."""
        raise NotImplementedError

    def entropy(self, theta):
        """H[q_v(· | θ_d)] for each coordinate, shape of ``theta``."""
        raise NotImplementedError

    def sample(self, key, theta, shape):
        """Draws of shape ``shape + theta.shape``."""
        raise NotImplementedError

    def probes(self) -> tuple[float, ...]:
        """Values of θ_d the fit tries, coordinate by coordinate, before it optimises (default none).

        For a family whose Gaussian member is a stationary point in θ (the skew-normal: skewness grows
        as ν³), the optimiser would stay there; the fit keeps each probe that raises the bound."""
        return ()

    def to_free(self, theta):
        """The optimiser's coordinates φ of θ (default φ = θ); `from_free` is the inverse.

        A family whose shape changes ever more slowly with θ (the skew-normal's at large |ν|) is
        better optimised in coordinates where its Fisher information is about constant, so that
        quasi-Newton steps of one scale suit every coordinate."""
        return theta

    def from_free(self, free):
        """θ from the optimiser's coordinates (inverse of `to_free`)."""
        return free

    def mean(self, theta):
        """⟨v_d⟩, shape of ``theta`` (0 for a standardised base)."""
        return jnp.zeros_like(theta)

    def variance(self, theta):
        """var v_d, shape of ``theta`` (1 for a standardised base)."""
        return jnp.ones_like(theta)

    def skewness(self, theta):
        """The standardised third cumulant κ₃/κ₂^{3/2} of v_d, shape of ``theta`` (0 unless overridden;
        used for coordinates narrower than a lattice cell, see `_site_lattice`)."""
        return jnp.zeros_like(theta)


class Normal(AbstractBase):
    """Standard normal coordinates: q is N(b, AAᵀ), and AI-KL is G-KL (up to the lattice)."""

    learn: bool = eqx.field(static=True, default=False)

    def log_density(self, v, theta):
        return -0.5 * (LOG_2PI + v**2) + 0.0 * theta

    def entropy(self, theta):
        return jnp.full_like(theta, 0.5 * (LOG_2PI + 1.0))

    def sample(self, key, theta, shape):
        return jax.random.normal(key, tuple(shape) + theta.shape, theta.dtype)


# Rule for ⟨log Φ(νr)⟩ under SN(0, 1, ν): trapezoid in t = r √(1 + ν²) on [-12, 12]. In t both
# factors of the integrand 2 N(r) Φ(νr) log Φ(νr) vary on scales of at least 1 whatever ν (those of
# N(r) and of Φ(νr) are √(1 + ν²) and √(1 + ν²)/|ν|) and decay by |t| = 12, so the rule is accurate
# to 10⁻¹¹ for every ν with 121 points (on r ∈ [-12, 12] it needed 2401 for ν ≤ 20 and failed beyond).
_SN_GRID = np.linspace(-12.0, 12.0, 121)


def _skew_constants(nu):
    delta = nu / jnp.sqrt(1.0 + nu**2)
    mu = delta * math.sqrt(2.0 / math.pi)
    sigma = jnp.sqrt(1.0 - mu**2)
    return delta, mu, sigma


class SkewNormal(AbstractBase):
    """Standardised skew-normal coordinates, θ_d = ν_d the skewness parameter (learned).

    z ~ SN(0, 1, ν) has density 2 N(z) Φ(νz), mean μ_ν = δ√(2/π) and variance σ_ν² = 1 − μ_ν²,
    δ = ν/√(1 + ν²); the base is v = (z − μ_ν)/σ_ν, so

        log q_v(v | ν) = log 2 + log σ_ν + log N(z) + log Φ(νz),  z = μ_ν + σ_ν v.

    H[q_v] = ½ log(2πe) − log 2 − ⟨log Φ(νz)⟩_{SN} − log σ_ν, the expectation by the trapezoid rule
    in t = z√(1 + ν²) on [−12, 12] (121 points, accurate to 10⁻¹¹ for every ν). ν = 0 is the standard normal, where the fit starts. The standardised
    density changes only at second order in ν there (the skewness grows as ν³), so the bound is
    stationary in ν at the Gaussian: the fit first tries ν_d = ±`probe` coordinate by coordinate and
    keeps those that raise the bound (`AbstractBase.probes`).

    The fit optimises ν in coordinates whose Fisher information is about constant (`to_free`), over
    |ν| ≤ `max_nu`.

    **Arguments:** `probe` (default 2.0; 0 disables the probes), `learn` (default True), `max_nu`
    (default 16: the largest |ν| the fit reaches; sharper skew-normals are finer than a K = 64 lattice
    resolves).
    """

    probe: float = eqx.field(static=True, default=2.0)
    learn: bool = eqx.field(static=True, default=True)
    max_nu: float = eqx.field(static=True, default=16.0)

    def __check_init__(self):
        if not (float(self.max_nu) > abs(float(self.probe))):
            raise ValueError(f"SkewNormal: `max_nu` must exceed |probe| ({self.probe!r}), got {self.max_nu!r}.")

    def probes(self):
        return (float(self.probe), -float(self.probe)) if self.probe else ()

    # The Fisher information of ν is about 0.9 (1 + |ν|)⁻³ for |ν| ≳ 4 (the density tends to the
    # half-normal ever more slowly), so in ν the bound is nearly flat where the fits end (|ν| ~ 5–15)
    # and L-BFGS crawled there (130–520 iterations at D = N = 10). φ ∝ sign(ν)(1 − (1 + |ν|)^{−1/2})
    # has dν/dφ ∝ (1 + |ν|)^{3/2}, so its information is about constant for |ν| ≳ 1, and it is linear
    # at 0 (the Gaussian stays stationary; the probes start the skewness): 2.5–3.5× fewer iterations.
    # φ ∈ [−1, 1] maps onto |ν| ≤ `max_nu`: a sharper edge than that (width ~σ/|ν|) is finer than a
    # K = 64 lattice resolves, and without the cap the fit followed the lattice error (ν → 240, a bound
    # 0.08 below its K = 64 value at K = 2048).
    def _free_scale(self):
        return 1.0 - 1.0 / math.sqrt(1.0 + float(self.max_nu))

    def to_free(self, theta):
        return jnp.sign(theta) * (1.0 - jax.lax.rsqrt(1.0 + jnp.abs(theta))) / self._free_scale()

    def from_free(self, free):
        # |φ| beyond 1 folds back (|ν| falls again) rather than clipping: a clipped coordinate has zero
        # gradient, and a step past the cap left the fit stuck there (D = 2: ν = 16 and a bound 0.008
        # below the optimum at ν ≈ 12).
        a = jnp.clip(1.0 - jnp.abs(1.0 - jnp.abs(free)), 0.0, 1.0) * self._free_scale()
        return jnp.sign(free) * (1.0 / (1.0 - a) ** 2 - 1.0)

    def log_density(self, v, theta):
        _, mu, sigma = _skew_constants(theta)
        z = mu + sigma * v
        return math.log(2.0) + jnp.log(sigma) - 0.5 * (LOG_2PI + z**2) + log_ndtr(theta * z)

    def entropy(self, theta):
        _, _, sigma = _skew_constants(theta)
        grid = jnp.asarray(_SN_GRID, theta.dtype)
        scale = jnp.sqrt(1.0 + theta**2)[..., None]
        r = grid / scale
        log_cdf = log_ndtr(theta[..., None] * r)
        density = 2.0 * jnp.exp(-0.5 * (LOG_2PI + r**2)) * jnp.exp(log_cdf)
        expected = (grid[1] - grid[0]) * jnp.sum(density * log_cdf, axis=-1) / scale[..., 0]
        return 0.5 * (LOG_2PI + 1.0) - math.log(2.0) - expected - jnp.log(sigma)

    def skewness(self, theta):
        _, mu, sigma = _skew_constants(theta)
        return 0.5 * (4.0 - math.pi) * (mu / sigma) ** 3

    def sample(self, key, theta, shape):
        delta, mu, sigma = _skew_constants(theta)
        k0, k1 = jax.random.split(key)
        shape = tuple(shape) + theta.shape
        z = delta * jnp.abs(jax.random.normal(k0, shape, theta.dtype)) \
            + jnp.sqrt(1.0 - delta**2) * jax.random.normal(k1, shape, theta.dtype)
        return (z - mu) / sigma


class GeneralisedNormal(AbstractBase):
    """Standardised generalised-normal coordinates with shape η > 1 (η = 2: normal; η → 1: Laplace).

    GN(r | η) = η / (2 s Γ(1/η)) exp(−|r/s|^η) with s² = Γ(1/η)/Γ(3/η), so var = 1;
    H = 1/η − log(η / (2 s Γ(1/η))). η ≤ 1 would make the bound non-differentiable (thesis §6.5).

    **Arguments:** `eta` (the starting / fixed η, > 1; default 1.5), `learn` (optimise one η per
    coordinate, parameterised as θ_d = log(η_d − 1); default False).
    """

    eta: float = 1.5
    learn: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        eta = np.asarray(self.eta)
        if eta.ndim != 0 or not np.isfinite(eta) or eta <= 1.0:
            raise ValueError(f"GeneralisedNormal: `eta` must be a scalar > 1 (η ≤ 1 makes the AI-KL bound "
                             f"non-differentiable), got {self.eta!r}; use e.g. eta=1.5 for heavy tails.")

    def init_theta(self, dim, dtype):
        return jnp.full((dim,), jnp.log(jnp.asarray(self.eta, dtype) - 1.0), dtype)  # η may be traced (a setting)

    def _eta(self, theta):
        return 1.0 + jnp.exp(theta)

    def _log_scale(self, eta):
        return 0.5 * (gammaln(1.0 / eta) - gammaln(3.0 / eta))

    def log_density(self, v, theta):
        eta = self._eta(theta)
        log_s = self._log_scale(eta)
        return jnp.log(eta) - math.log(2.0) - log_s - gammaln(1.0 / eta) - _pow_abs(v * jnp.exp(-log_s), eta)

    def entropy(self, theta):
        eta = self._eta(theta)
        return 1.0 / eta - jnp.log(eta) + math.log(2.0) + self._log_scale(eta) + gammaln(1.0 / eta)

    def sample(self, key, theta, shape):
        eta = self._eta(theta)
        k0, k1 = jax.random.split(key)
        shape = tuple(shape) + theta.shape
        g = jax.random.gamma(k0, jnp.broadcast_to(1.0 / eta, shape), dtype=theta.dtype)
        sign = jnp.where(jax.random.bernoulli(k1, 0.5, shape), 1.0, -1.0).astype(theta.dtype)
        return sign * g ** (1.0 / eta) * jnp.exp(self._log_scale(eta))


# ------------------------------------------------------------------------------------- parameters


class AIKLParams(eqx.Module):
    """Parameters of q: w = A v + b with A = ``lower @ upper``.

    - `loc`: b, shape ``(D,)``.
    - `lower`: L, shape ``(D, D)``, lower-triangular (entries above the diagonal are ignored).
    - `upper`: U, shape ``(D, D)``, upper-triangular (entries below the diagonal are ignored).
    - `theta`: the bases' shape parameters, shape ``(D,)``.

    log|det A| = Σ_d log|L_dd| + log|U_dd|. A sign of a diagonal entry is a valid point (the bound's
    entropy term keeps the diagonals away from 0).
    """

    loc: jax.Array
    lower: jax.Array
    upper: jax.Array
    theta: jax.Array

    @property
    def A(self):
        """A = L U, shape ``(D, D)``."""
        return jnp.tril(self.lower) @ jnp.triu(self.upper)

    def logdet(self):
        """log|det A|."""
        return jnp.sum(jnp.log(jnp.abs(jnp.diag(self.lower)))) + jnp.sum(jnp.log(jnp.abs(jnp.diag(self.upper))))


def _moments(params, base):
    """Mean ``(D,)`` and a factor C with CᵀC = cov(w) (``(D, D)``, not triangular) of q."""
    A = params.A
    return params.loc + A @ base.mean(params.theta), jnp.sqrt(base.variance(params.theta))[:, None] * A.T


# ---------------------------------------------------------------------------------------- lattice


def _fft_size(dim: int, lattice_points: int, padding: str) -> int:
    atoms = dim * (lattice_points - 1) + 1
    if padding == "window":
        atoms = min(atoms, 2 * lattice_points)
    return 1 << (atoms - 1).bit_length()


# Components of y narrower than _NARROW lattice spacings (standard deviation) enter by their cumulants
# (Gaussian with the base's skewness), wider than _WIDE by their point-sampled densities, and
# in between by a smooth mixture of the two (see `_site_lattice`).
_NARROW, _WIDE = 1.0, 2.0
_SMALL_DIVISOR = 2  # the smaller selection of `_site_lattice`: half of `_wide_count`


def _smoothstep(x):
    x = jnp.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _wide_count(dim: int, lattice_points: int, span: float) -> int:
    """How many of D components can be wider than `_NARROW` lattice spacings, at most.

    Component d of y has width r_d = |α_d| sd(v_d) / Δ in lattice spacings, and Δ = 2 span σ_y / (K − 1)
    with σ_y² = Σ_d (α_d sd v_d)², so Σ_d r_d² = ((K − 1) / (2 span))² whatever α: at most
    ⌊((K − 1) / (2 span _NARROW))²⌋ components have r_d > _NARROW (27 at K = 64, span 6), and all
    others take the cumulant branch of `_site_lattice` exactly (weight 0 on their samples)."""
    return min(dim, int(math.floor(((lattice_points - 1) / (2.0 * span * _NARROW)) ** 2)))


def _spectrum(parts, base, lattice_points, size, omega, count):
    """The product of the D components' transforms for each site, ``(N, size//2 + 1)``, centred on
    the mean (see `_site_lattice`), transforming the sampled densities of the ``count`` widest
    components of each site only: the others must be narrower than `_NARROW` spacings (mix weight 0),
    and their cumulant factors multiply to exp(−½ω² Σ s_d² + iω³ Σ κ_d s_d³ / 6)."""
    alpha, scale, theta, vbar, kappa, delta, sigma_y = parts
    num, dim = alpha.shape
    K = lattice_points
    skewed = kappa is not None
    log_rest = None
    if count < dim:
        _, idx = jax.lax.top_k(jax.lax.stop_gradient(jnp.abs(scale)), count)  # (N, M)
        rest = jnp.ones((num, dim), bool).at[jnp.arange(num)[:, None], idx].set(False)
        s_rest = jnp.where(rest, scale, 0.0)
        log_rest = -0.5 * jnp.sum(s_rest**2, axis=-1)[:, None] * omega**2  # (N, F)
        if skewed:
            log_rest = log_rest + 1j * (jnp.sum(kappa * s_rest**3, axis=-1)[:, None] * omega**3 / 6.0)
        take = lambda a: jnp.take_along_axis(a, idx, axis=-1)
        alpha, scale, theta, vbar = take(alpha), take(scale), take(theta), take(vbar)
        kappa = take(kappa) if skewed else None
    centre = K // 2
    offsets = jnp.arange(K, dtype=alpha.dtype) - centre  # the centre point sits on each u_d's mean
    # u_d = α_d v_d at u = α_d v̄_d + Δ k; its density there ∝ q_v(v̄_d + Δ k / α_d). A coordinate with
    # α_d ≈ 0 is a point mass at its mean (and takes the cumulant branch below).
    tiny = 1e-12 * sigma_y[:, None]
    safe_alpha = jnp.where(jnp.abs(alpha) > tiny, alpha, jnp.where(alpha < 0, -tiny, tiny))
    v = vbar[..., None] + (delta[:, None, None] * offsets) / safe_alpha[..., None]  # (N, M, K)
    log_w = base.log_density(v, theta[..., None])
    pi = jax.nn.softmax(log_w, axis=-1)
    # Each lattice is transformed centred on its mean: the points k ≥ centre at cyclic indices
    # 0, 1, …, those below at the end of the zero-padded array (numpy's rfft is Σ_k x_k e^{−iωk}: this
    # is the transform of the law with its mean at index 0, as the cumulant branch below).
    padded = jnp.concatenate([pi[..., centre:], jnp.zeros(pi.shape[:-1] + (size - K,), pi.dtype), pi[..., :centre]],
                             axis=-1)
    sampled = jnp.fft.rfft(padded, axis=-1)  # (N, M, size//2 + 1)
    ws = scale[..., None] * omega  # (N, M, F)
    # log φ(−ω) = −iωκ₁ − ½ω²κ₂ + iω³κ₃/6 (κ₁ = 0 here); real for a base without skewness.
    cumulant = jnp.exp(-0.5 * ws**2)
    if skewed:
        cumulant = cumulant * jnp.exp(1j * kappa[..., None] * ws**3 / 6.0)
    mix = _smoothstep((jnp.abs(scale) - _NARROW) / (_WIDE - _NARROW))[..., None]
    spectrum = jnp.prod(mix * sampled + (1.0 - mix) * cumulant, axis=-2)  # (N, size//2 + 1)
    if log_rest is not None:
        spectrum = spectrum * jnp.exp(log_rest)
    return spectrum


def _site_lattice(alpha, beta, params, base, lattice_points, padding, span=_SPAN):
    """The lattice densities of y_n = α_nᵀv + β_n for a block of sites.

    ``alpha``: ``(N, D)``; ``beta``: ``(N,)``. Returns atoms ``(N, P)`` (increasing, spacing Δ_n) and
    weights ρ ``(N, P)`` (summing to one), P the FFT length (see the module docstring).

    Each u_d = α_d v_d enters the product of transforms by one of two representations, mixed by a
    smooth step in its width in lattice spacings, r_d = |α_d| sd(v_d) / Δ:

    - wide (r_d ≥ 2): the DFT of its density sampled at the lattice points (the trapezoid rule,
      accurate to e^{−2π² r²} for smooth bases);
    - narrow (r_d ≤ 1): its cumulant transform to third order, exp(−iωκ₁ − ½ω²κ₂ + iω³κ₃/6) in lattice
      units, exact in mean, variance and skewness. Point samples of a component narrower than a
      lattice cell put all its mass on one point and lose its variance: at D = 100 (half the
      components narrower than Δ at K = 64) that overstated the bound by 3 nats at the G-KL optimum,
      and the optimiser steered into it.

    Only M = `_wide_count` components per site can be wider than one spacing (27 at K = 64): the
    densities are sampled and transformed for the M widest of each site alone, and the product of
    the others' cumulant factors is one exponential of their summed cumulants. The value is the
    same as transforming every component (at D = 100, K = 64 this is 3.7× less work).
    """
    num, dim = alpha.shape
    K = lattice_points
    theta = params.theta
    vbar, sd = base.mean(theta), jnp.sqrt(base.variance(theta))
    width = alpha * sd  # signed sd of u_d, (N, D)
    var_y = jnp.sum(width**2, axis=-1)  # (N,)
    positive = var_y > 0
    sigma_y = jnp.where(positive, jnp.sqrt(jnp.where(positive, var_y, 1.0)), 1.0)
    delta = 2.0 * span * sigma_y / (K - 1)  # (N,)
    scale = width / delta[:, None]  # signed width of u_d in lattice spacings, (N, D)
    size = _fft_size(dim, K, padding)
    omega = (2.0 * math.pi / size) * jnp.arange(size // 2 + 1, dtype=alpha.dtype)
    skewed = type(base).skewness is not AbstractBase.skewness
    kappa = base.skewness(theta) if skewed else None
    shift = beta + alpha @ vbar  # y's mean, (N,)
    theta, vbar = jnp.broadcast_to(theta, (num, dim)), jnp.broadcast_to(vbar, (num, dim))
    kappa = jnp.broadcast_to(kappa, (num, dim)) if skewed else None
    parts = (alpha, scale, theta, vbar, kappa, delta, sigma_y)
    spectrum_of = lambda count, parts: _spectrum(parts, base, K, size, omega, count)
    count = _wide_count(dim, K, span)
    if count < dim:
        # Fewer components are usually wide than can be (at most 8–13 of 100 at D = 100, K = 64 on
        # Table 6.1 problems, against 27): when no site has more than half that, the smaller selection
        # gives the same value (a gradient at 0.03 instead of 0.07 CPU-s there).
        small = max(1, count // _SMALL_DIVISOR)
        most = jnp.max(jnp.sum(jnp.abs(scale) > _NARROW, axis=-1))
        # Each branch is rematerialised for the gradient: its residuals are then its inputs alone,
        # which both branches share (otherwise the residuals of the branch not taken are zero-filled
        # arrays of full size, which cost as much as the smaller branch saves).
        branch = lambda c: jax.checkpoint(partial(spectrum_of, c))
        spectrum = jax.lax.cond(most <= small, branch(small), branch(count), parts)
    else:
        spectrum = spectrum_of(count, parts)
    rho = jnp.fft.irfft(spectrum, n=size, axis=-1)  # cyclic index = Σ_d k_d mod size, the mean at 0
    # Reorder to the window of `size` atoms centred on the mean.
    rho = jnp.roll(rho, size // 2, axis=-1)
    atoms = shift[:, None] + delta[:, None] * (jnp.arange(size, dtype=alpha.dtype) - size // 2)
    return atoms, rho


def _project_columns(projection, A):
    """H A, shape ``(N, D)``, for any projection."""
    return jax.vmap(projection.mv, in_axes=1, out_axes=1)(A)


def _kink_jumps(potential, centre, width):
    """The jump f'(c⁺) − f'(c⁻) of f = log φ at c = ``centre`` (0 where φ is smooth there), by autodiff
    at c ± 10⁻⁶ ``width``."""
    step = 1e-6 * width
    slope = lambda x: jax.jvp(potential.log_phi, (x,), (jnp.ones_like(x),))[1]
    return slope(centre + step) - slope(centre - step)


def _expect(potential, atoms, rho):
    """⟨log φ_n(y_n)⟩ on the lattice, shape ``(N,)``: Σ_j ρ_nj log φ_n(atom_nj), corrected at kinks.

    The sum is the trapezoid rule for ∫ q_y log φ. Where log φ has a kink (the centres of
    ``potential._peaks()``, e.g. a Laplace site's location), the rule errs by −J q_y(c) Δ² B₂(θ)/2,
    with J the jump of (log φ)' at c, θ the position of c between two atoms in units of Δ and
    B₂(θ) = θ² − θ + 1/6 (Euler–Maclaurin): an O(Δ²) error that oscillates with θ, which the fit could
    tune b to. It is added back, with q_y(c) interpolated from the lattice, leaving O(Δ³).
    Atoms whose weight is FFT round-off are left out.
    """
    values = jax.vmap(potential.log_phi, in_axes=1, out_axes=1)(atoms)
    floor = 64 * jnp.finfo(rho.dtype).eps * jnp.max(rho, axis=-1, keepdims=True)
    keep = rho > floor
    out = jnp.sum(jnp.where(keep, rho * jnp.where(keep, values, 0.0), 0.0), axis=-1)
    num, size = atoms.shape
    delta, first = atoms[:, 1] - atoms[:, 0], atoms[:, 0]
    for centre, width in potential._peaks():
        centre = jnp.broadcast_to(jnp.asarray(centre, atoms.dtype), (num,))
        width = jnp.broadcast_to(jnp.asarray(width, atoms.dtype), (num,))
        jump = _kink_jumps(potential, centre, width)
        position = (centre - first) / delta
        index = jnp.floor(position)
        theta = position - index
        i = jnp.clip(index.astype(jnp.int32), 0, size - 2)
        inside = (index >= 0) & (index <= size - 2)
        take = lambda k: jnp.take_along_axis(rho, k[:, None], axis=-1)[:, 0]
        mass = jnp.where(inside, (1.0 - theta) * take(i) + theta * take(i + 1), 0.0)  # ≈ q_y(c) Δ
        out = out + jump * mass * delta * (theta**2 - theta + 1.0 / 6.0) / 2.0
    return out


def site_expectations(params: AIKLParams, model: LatentLinearModel, base: AbstractBase, lattice_points: int = 256,
                      padding: str = "window", span: float = _SPAN):
    """⟨log φ_n(h_nᵀw + c_n)⟩ under q for every site: a tuple with one ``(N_g,)`` array per site group.

    ``span``: the lattice end points, ±span σ_y (default 6, the thesis's choice; it leaves out the mass
    beyond, e.g. 2·10⁻⁶ for a skew-normal with ν = 2.5)."""
    A = params.A
    out = []
    for group in model.sites:
        alpha = _project_columns(group.projection, A)
        beta = group.project(params.loc)
        atoms, rho = _site_lattice(alpha, beta, params, base, lattice_points, padding, span)
        out.append(_expect(group.potential, atoms, rho))
    return tuple(out)


def bound(params: AIKLParams, model: LatentLinearModel, base: AbstractBase, lattice_points: int = 256,
          padding: str = "window", span: float = _SPAN):
    """The AI-KL bound on log Z at ``params`` (a pure, differentiable scalar; see the module docstring).

    ``lattice_points`` (K), ``padding`` and ``span`` set the lattice of the site terms (`site_expectations`);
    the other terms are exact.
    """
    value = params.logdet() + jnp.sum(base.entropy(params.theta))
    if model.prior is not None:
        mean, C = _moments(params, base)
        value = value + model.prior.log_density(mean) - 0.5 * model.prior.trace_gram(C)
    for expected in site_expectations(params, model, base, lattice_points, padding, span):
        value = value + jnp.sum(expected)
    return value


def lattice_densities(params: AIKLParams, base: AbstractBase, H, offset=0.0, lattice_points: int = 256,
                      padding: str = "window", span: float = _SPAN):
    """The densities of y = H w + offset under q on their lattices.

    Returns ``(points, density)``, each ``(N, P)``: increasing points with spacing Δ_n and the density
    there (ρ / Δ_n, integrating to one by the rectangle rule). ``H``: ``(N, D)`` array, BCOO or projection.
    """
    projection = as_projection(H)
    alpha = _project_columns(projection, params.A)
    beta = projection.mv(params.loc) + offset
    atoms, rho = _site_lattice(alpha, beta, params, base, lattice_points, padding, span)
    return atoms, rho / (atoms[:, 1:2] - atoms[:, 0:1])


# ------------------------------------------------------------------------------------------ method


class AIKLInfo(eqx.Module):
    """What `vj.AIKL` reports beyond the common `Diagnostics` (``post.diagnostics.info``).

    - `lattice_points`: the K at which ``log_z`` was evaluated (the first of K₀, 2K₀, 4K₀, … whose bound
      differs from the next coarser one by less than ``tol_k``, or the finest tried); scalar int.
    - `lattice_change`: |B(K) − B(K/2)| at that K; scalar.
    - `gaussian_log_z`: the G-KL bound at the Gaussian the fit started from (NaN with a warm start).
    - `start_log_z`: the AI-KL bound at the start, on the lattice of ``log_z``.
    - `fell_back`: True when the optimum's bound came out below the start's (the optimiser followed
      lattice error): the posterior is then the start, and `vj.infer` warns.
    """

    lattice_points: jax.Array
    lattice_change: jax.Array
    gaussian_log_z: jax.Array
    start_log_z: jax.Array
    fell_back: jax.Array

    def __repr__(self):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(self)):
            return super().__repr__()
        return (f"AIKLInfo(lattice_points={int(self.lattice_points)}, lattice_change={float(self.lattice_change):.3g}, "
                f"gaussian_log_z={float(self.gaussian_log_z):.6g}, start_log_z={float(self.start_log_z):.6g}, "
                f"fell_back={bool(self.fell_back)})")


class AIKLState(eqx.Module):
    """The State of `vj.AIKL` (``post.state``): the parameters (b, L, U, θ), whether the fit probes θ
    before optimising (True for a start from a Gaussian, False for a restart) and the base's class name
    (a state restarts a fit with the same base only)."""

    params: AIKLParams
    probe: jax.Array
    base: str = eqx.field(static=True)


class AIKLPosterior(Posterior):
    """A `Posterior` for AI-KL: q(w) is the density of A v + b, not a Gaussian.

    ``mean`` and ``covariance`` (and ``marginals(H)``: means and variances) are q's exact moments;
    ``sample`` draws from q itself; ``marginal_densities(H)`` gives the lattice densities of H w.
    ``params`` (also ``state``, for warm starts) holds (b, L, U, θ); ``base`` the base family.
    """

    params: AIKLParams
    base: AbstractBase
    lattice_points: int = eqx.field(static=True)
    padding: str = eqx.field(static=True)
    span: float = eqx.field(static=True)

    def __init__(self, params, base, lattice_points, padding, span, log_z, diagnostics, model):
        mean, C = _moments(params, base)
        S = C.T @ C
        S = 0.5 * (S + S.T)
        factor = CholeskyFactor.from_matrix(jnp.linalg.cholesky(S).T)
        super().__init__(mean, factor, log_z, diagnostics, model, bound_claim=True,
                         state=AIKLState(params, jnp.array(False), type(base).__name__))
        self.params = params
        self.base = base
        self.lattice_points = lattice_points
        self.padding = padding
        self.span = span

    def sample(self, key, num_samples: int):
        """``num_samples`` draws from q (w = A v + b, v from the bases): shape ``(num_samples, D)``."""
        v = self.base.sample(key, self.params.theta, (num_samples,))
        return self.params.loc + v @ self.params.A.T

    def marginal_densities(self, H, offset=0.0, lattice_points: int | None = None):
        """The densities of H w + offset under q on lattices: ``(points, density)``, each ``(N, P)``
        (see `lattice_densities`); ``lattice_points`` defaults to the K of ``log_z``."""
        K = self.lattice_points if lattice_points is None else int(lattice_points)
        return lattice_densities(self.params, self.base, H, offset, K, self.padding, self.span)


def _check_positive_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"AIKL: `{name}` must be an integer ≥ {minimum}, got {value!r}.")


class AIKL(AbstractMethod):
    """Affine-independent KL inference: maximise `bound` over (L, U, b, θ).

    **Arguments:**

    - `base`: the family of the coordinates of v: `SkewNormal()` (default; skewness per coordinate
      learned), `Normal()` (then q is Gaussian and this is G-KL), `GeneralisedNormal(eta)` (η > 1,
      fixed or learned), or any `AbstractBase`.
    - `lattice_points`: K, lattice points per coordinate during the fit (default 64: with the cumulant
      treatment of narrow components and the kink correction its error is below 10⁻³ on the
      problems of ``benchmarks/aikl.py``, and each evaluation costs about a quarter of K = 256's; the
      D = N = 10 logistic regression's bound agrees with the K = 256 fit's to 5·10⁻⁴). The optimiser
      finds the optimum of the discretised bound; the reported ``log_z`` is re-evaluated on finer
      lattices, and if it comes out below the start's on the same lattice (the optimiser followed
      lattice error) the start is returned, with a warning (``diagnostics.info.fell_back``).
    - `solver`: a `vj.solvers` solver (default `LBFGS(tol=1e-6, max_iter=1000, gain_tol=tol_k)`: it
      stops once a squared decrement is below 10⁻⁶ or the bound rose by less than `tol_k` over the
      last 10 iterations. The optimum of the K-point bound is only as good as its lattice error, about
      `tol_k` or more; on the D = N = 10 logistic regressions of ``benchmarks/aikl_speed.py`` the
      gain test stops after 40–77 iterations (47–121 without it), the bounds at K = 1024 within
      6·10⁻⁴ of the longer runs' but for one 3·10⁻³ higher).
    - `padding`: ``"window"`` (default) or ``"full"`` (see the module docstring).
    - `span`: lattice end points at ±span σ_y for each site (default 6, as in the thesis).
    - `tol_k`: the final bound is re-evaluated at 2K, 4K, … until it changes by less than this
      (default 1e-3), at most `max_doublings` times (default 4).
    - `scheme`: ``"joint"`` (default: the solver maximises over (L, U, b, θ) at once) or
      ``"blockwise"`` (the thesis's scheme for log-concave sites: (L, b, θ) with U fixed, then
      (U, b, θ) with L fixed, each block a concave problem for fixed θ, until a cycle gains less than
      ``tol_k / 100``, after `max_cycles` cycles (default 20), or once the sweeps have spent the
      solver's `max_iter` iterations; see `_blockwise`). On the D = N = 10 logistic regression of ``benchmarks/aikl_speed.py``
      the joint scheme is the faster (see docs/guide/aikl.md).

    ``vj.infer(model, vj.AIKL())`` returns an `AIKLPosterior` whose ``log_z`` is the bound (a lower
    bound on log Z up to the lattice error, which ``diagnostics.info.lattice_change`` estimates). Without
    ``init`` the fit starts from the G-KL optimum (``vj.GKL()``) with the bases at their Gaussian member
    (θ from `AbstractBase.init_theta`), so when the base family contains the Gaussian the AI-KL bound
    is at least the G-KL one. The State is an `AIKLState` (``post.state``): an AI-KL posterior of the same
    base restarts from its parameters; any other posterior starts from its mean and covariance.
    """

    base: AbstractBase = SkewNormal()
    lattice_points: int = eqx.field(static=True, default=64)
    solver: AbstractSolver | None = None
    padding: str = eqx.field(static=True, default="window")
    span: float = eqx.field(static=True, default=_SPAN)
    tol_k: float = 1e-3
    max_doublings: int = eqx.field(static=True, default=4)
    scheme: str = eqx.field(static=True, default="joint")
    max_cycles: int = eqx.field(static=True, default=20)

    def __check_init__(self):
        if not isinstance(self.base, AbstractBase):
            raise ValueError(f"AIKL: `base` must be a vj.aikl base such as vj.aikl.SkewNormal(), got "
                             f"{type(self.base).__name__}.")
        _check_positive_int("lattice_points", self.lattice_points, 8)
        _check_positive_int("max_doublings", self.max_doublings, 0)
        if self.scheme not in _SCHEMES:
            raise ValueError(f"AIKL: `scheme` must be one of {_SCHEMES}, got {self.scheme!r}.")
        _check_positive_int("max_cycles", self.max_cycles, 1)
        if self.padding not in _PADDINGS:
            raise ValueError(f"AIKL: `padding` must be one of {_PADDINGS}, got {self.padding!r}.")
        if self.solver is not None and not isinstance(self.solver, AbstractSolver):
            raise ValueError(f"AIKL: `solver` must be a vj.solvers solver such as vj.solvers.LBFGS(), got "
                             f"{type(self.solver).__name__}.")
        if not (float(self.span) >= 3.0):
            raise ValueError(f"AIKL: `span` must be at least 3 (lattice end points at ±span σ_y), got {self.span!r}.")
        if not (float(self.tol_k) > 0):
            raise ValueError(f"AIKL: `tol_k` must be positive, got {self.tol_k!r}.")

    def _solver(self):
        return self.solver if self.solver is not None else LBFGS(tol=1e-6, max_iter=1000, gain_tol=self.tol_k)

    # The State is an `AIKLState`: (b, L, U, θ) and whether to probe θ before optimising (a start from a
    # Gaussian). The cold start is the G-KL optimum (`vj.GKL()`, fitted inside the start's program) with
    # the bases at their Gaussian member.

    def init_state(self, model) -> "AIKLState":
        gkl = GKL()
        post = gkl.solve(model, gkl.init_state(model))
        return self.from_gaussian(model, post.mean, post.factor)

    def from_gaussian(self, model, mean, factor) -> "AIKLState":
        """The bases at their Gaussian member (θ from `AbstractBase.init_theta`), standardised so that q has
        the Gaussian's mean and covariance: w = b + A v, ⟨v⟩ = v̄, var v = s², A = chol(S) diag(1/s),
        b = m − A v̄; θ is probed first."""
        dim, dtype = model.dim, model.dtype
        theta = self.base.init_theta(dim, dtype)
        S = factor.dense()
        lower = jnp.linalg.cholesky(0.5 * (S + S.T)) / jnp.sqrt(self.base.variance(theta))[None, :]
        loc = mean - lower @ self.base.mean(theta)
        params = AIKLParams(loc, lower, jnp.eye(dim, dtype=dtype), theta)
        return AIKLState(params, jnp.array(True), type(self.base).__name__)

    def from_expansion(self, model, expansion) -> "AIKLState":
        frozen = jax.lax.stop_gradient(model)
        return self.from_gaussian(model, expansion.mode, Full().from_curvature(expansion.curvature(frozen)))

    def is_state(self, model, state) -> bool:
        if not (isinstance(state, AIKLState) and state.base == type(self.base).__name__):
            return False
        theta = jax.eval_shape(lambda: self.base.init_theta(model.dim, model.dtype))
        d = (model.dim,)
        template = AIKLParams(*(jax.ShapeDtypeStruct(s, model.dtype) for s in (d, d * 2, d * 2)), theta)
        return same_shapes(state.params, template)

    def report(self, post) -> str | None:
        info = post.diagnostics.info
        if not bool(info.fell_back):
            return None
        return (f"AIKL: re-evaluated at K = {int(info.lattice_points)}, the optimum's bound is below the start's "
                f"({float(info.start_log_z):.6g}): the optimiser followed lattice error at K = "
                f"{self.lattice_points}, so the posterior is the start. Raise `lattice_points`.")

    def _probe(self, start, model):
        """θ after trying each of the base's probe values in each coordinate in turn, keeping improvements."""
        probes = jnp.asarray(self.base.probes(), start.theta.dtype)
        value = lambda theta: bound(eqx.tree_at(lambda p: p.theta, start, theta), model, self.base,
                                    self.lattice_points, self.padding, self.span)

        # One scan over (coordinate, value) trials, the first the start itself (kept whatever its value,
        # as the best so far is −∞), so the bound is traced once.
        dim, count = model.dim, probes.shape[0]
        coords = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.repeat(jnp.arange(dim, dtype=jnp.int32), count)])
        values = jnp.concatenate([start.theta[:1], jnp.tile(probes, dim)])

        def trial(carry, dt):
            theta, best = carry
            candidate = theta.at[dt[0]].set(dt[1])
            v = value(candidate)
            better = v > best
            return (jnp.where(better, candidate, theta), jnp.where(better, v, best)), None

        minus_inf = jnp.full((), -jnp.inf, start.theta.dtype)
        (theta, _), _ = jax.lax.scan(trial, (start.theta, minus_inf), (coords, values))
        return theta

    def _optimise(self, frozen, start, probe):
        """Maximise the bound at K from ``start``: the solver's solution and the optimum's parameters."""
        K, padding, base, span = self.lattice_points, self.padding, self.base, self.span
        dim = frozen.dim
        # Coordinates relative to the start: lower = L₀(I + strict(X)), loc = b₀ + L₀c, upper = U, θ.
        L0 = jnp.tril(start.lower)
        strict = jnp.tril(jnp.ones((dim, dim), bool), -1)
        upper_mask = jnp.triu(jnp.ones((dim, dim), bool))

        def as_params(z):
            X, U, c, theta = z
            return AIKLParams(start.loc + L0 @ c, L0 + L0 @ jnp.where(strict, X, 0.0), jnp.where(upper_mask, U, 0.0),
                              base.from_free(theta) if base.learn else start.theta)

        theta0 = start.theta
        if base.learn and base.probes():
            theta0 = jax.lax.cond(probe, lambda: self._probe(start, frozen), lambda: start.theta)
        # θ enters through the base's free coordinates (`AbstractBase.to_free`).
        z0 = (jnp.zeros((dim, dim), L0.dtype), jnp.triu(start.upper), jnp.zeros((dim,), L0.dtype),
              base.to_free(theta0))
        free0 = tuple(z0) if base.learn else tuple(z0[:3])
        x0, unravel = ravel_pytree(free0)

        def objective(x):
            z = unravel(x)
            z = z if base.learn else (*z, None)
            return bound(as_params(z), frozen, base, K, padding, span)

        if self.scheme == "blockwise":
            # 1 where a coordinate of x belongs to the (L, b, θ) block, 0 where it is one of U's.
            in_lower = (jnp.ones((dim, dim)), jnp.zeros((dim, dim)), jnp.ones((dim,)), jnp.ones((dim,)))
            sol = self._blockwise(objective, x0, ravel_pytree(in_lower[:len(free0)])[0] > 0.5)
        else:
            sol = self._solver().maximise(objective, x0)
        z = unravel(sol.x)
        return sol, jax.lax.stop_gradient(as_params(z if base.learn else (*z, None)))

    def _blockwise(self, objective, x0, in_lower):
        """The blockwise scheme: the solver maximises over (L, b, θ) with U fixed, then over (U, b, θ)
        with L fixed, and so on, until a full cycle raises the bound by less than ``tol_k / 100``, after
        `max_cycles` cycles, or once the sweeps have spent the solver's `max_iter` iterations. For log-concave
        sites and fixed θ each block is a concave problem (thesis §6.4), where the joint one is not.

        One `lax.while_loop` over sweeps whose body holds the solver (so the objective is traced once);
        the frozen block enters through `stop_gradient`, so its gradient is zero and a quasi-Newton
        direction built from such gradients leaves it where it is. The trace holds the bound after
        each sweep (``trace[0]``, the start's, is left NaN: evaluating it would trace the bound again)."""
        solver = self._solver()
        tol = self.tol_k / 100.0
        max_sweeps = 2 * self.max_cycles
        dtype = x0.dtype
        nan = jnp.full((), jnp.nan, dtype)

        def sweep(s):
            x, trace, i, iters, grads, _, _, _ = s
            free = jnp.where(i % 2 == 0, in_lower, ~in_lower)
            sol = solver.maximise(lambda y: objective(jnp.where(free, y, jax.lax.stop_gradient(y))), x)
            return (sol.x, trace.at[i + 1].set(sol.value), i + 1, iters + sol.iterations,
                    grads + sol.num_grad_evals, sol.converged, sol.grad_norm, sol.decrement)

        def settled(trace, i):
            return (i >= 2) & (i % 2 == 0) & (trace[i] - trace[jnp.maximum(i - 2, 0)] < tol)

        def unfinished(s):
            _, trace, i, iters, *_ = s
            return (i < max_sweeps) & (iters < solver.max_iter) & ~settled(trace, i)

        zero = jnp.array(0)
        state = (x0, jnp.full((max_sweeps + 1,), jnp.nan, dtype), zero, zero, zero, jnp.array(False), nan, nan)
        x, trace, i, iters, grads, converged, grad_norm, decrement = jax.lax.while_loop(unfinished, sweep, state)
        converged = converged & settled(trace, i)
        return Solution(x, trace[i], grad_norm, iters, converged, trace, zero, grads, zero, decrement)

    def _value(self, params, frozen, k):
        """The bound at ``params`` on the lattice of K = ``k``."""
        return bound(params, frozen, self.base, k, self.padding, self.span)

    def _pair(self, opt, start, frozen, k):
        """The bound at the optimum and at the start on the lattice of K = ``k``, shape ``(2,)``."""
        pair = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), opt, start)
        return jax.vmap(lambda p: bound(p, frozen, self.base, k, self.padding, self.span))(pair)

    def _lattices(self):
        return [self.lattice_points * 2**j for j in range(self.max_doublings + 1)]

    def _result(self, model, start, opt, sol, gaussian, index, pairs, change):
        """The posterior from the optimum's and the start's bounds ``pairs[index]`` on the chosen lattice.

        The start is a point of the family too: if the optimum's re-evaluated bound is below the
        start's (the fit followed the coarse lattice's error), the start is the answer (``fell_back``)."""
        ks = self._lattices()
        base, padding, span = self.base, self.padding, self.span
        value, start_value = pairs[0], pairs[1]
        fell_back = start_value > value
        opt = jax.tree_util.tree_map(lambda a, b: jnp.where(fell_back, a, b), start, opt)
        value = jnp.where(fell_back, start_value, value)
        branches = [lambda p, m, k=k: bound(p, m, base, k, padding, span) for k in ks]
        log_z = computed(value, lambda p, m, i: jax.lax.switch(i, branches, p, m), opt, model, index)
        info = AIKLInfo(lattice_points=jnp.asarray(ks)[index], lattice_change=change, gaussian_log_z=gaussian,
                        start_log_z=start_value, fell_back=fell_back)
        diagnostics = Diagnostics.from_solution(sol, method="AIKL", solver=type(self._solver()).__name__, info=info)
        # the densities and samples of the posterior use the finest lattice
        return AIKLPosterior(opt, base, ks[-1], padding, span, log_z, diagnostics, model)

    def solve(self, model: LatentLinearModel, state: "AIKLState") -> AIKLPosterior:
        frozen = jax.lax.stop_gradient(model)
        start, probe = jax.lax.stop_gradient((state.params, state.probe))
        mean, C = _moments(start, self.base)
        # The G-KL bound at the Gaussian with the start's moments (the G-KL optimum for a cold start).
        gaussian = bound_at(mean, C.T @ C, frozen)
        sol, opt = self._optimise(frozen, start, probe)
        # The final bound: double K until it changes by less than tol_k.
        ks = self._lattices()
        pairs = jnp.stack([self._pair(opt, start, frozen, k) for k in ks])  # (len(ks), 2)
        pairs = pairs.at[0, 0].set(sol.value)
        changes = jnp.abs(jnp.diff(pairs[:, 0]))
        if self.max_doublings:
            settled = changes < self.tol_k
            index = jnp.where(jnp.any(settled), jnp.argmax(settled) + 1, self.max_doublings)
            change = changes[index - 1]
        else:
            index, change = jnp.array(0), jnp.full((), jnp.nan, pairs.dtype)
        return self._result(model, start, opt, sol, gaussian, index, pairs[index], change)


def __dir__():
    return list(__all__)
