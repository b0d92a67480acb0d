"""Affine-independent KL (AI-KL): non-Gaussian approximations with a lower bound on log Z.

q(w) is the density of w = A v + b, A = L U, with independent coordinates v_d ~ q_v(· | θ_d)
(Challis & Barber, NIPS 2012). For p(w) ∝ f(w) ∏_n φ_n(h_nᵀw + c_n),

$$
\\log Z \\ge \\mathcal B = \\log|\\det A| + \\sum_d H[q_v(\\cdot\\mid\\theta_d)]
+ \\langle \\log f(w) \\rangle_q + \\sum_n \\langle \\log \\varphi_n(y_n) \\rangle_{q_{y_n}},
\\qquad y_n = \\alpha_n^\\top v + \\beta_n,\\ \\alpha_n = A^\\top h_n,\\ \\beta_n = h_n^\\top b + c_n.
$$

Each ⟨log φ_n⟩ is a sum over a K-point lattice (±span·σ_y) of the density of y_n, the FFT convolution of
the components' lattice densities; narrow components enter by their cumulants and kinks of log φ get an
Euler–Maclaurin correction, so the optimiser cannot exploit the lattice.
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

from .. import _checks
from .._linalg import LOG_2PI, gaussian_entropy
from ..covariance import CholeskyFactor, Full
from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..projections import as_projection
from ..solvers import LBFGS, AbstractSolver, Solution, Status, iterate
from ._base import AbstractMethod, same_shapes
from ._envelope import computed
from .gkl import GKL, bound_at

__all__ = ["AbstractBase", "Normal", "SkewNormal", "GeneralisedNormal", "AIKLParams", "AIKLState", "AIKLInfo", "AIKLPosterior",
           "AIKL", "bound", "site_expectations", "lattice_densities"]
__dir__ = __all__.copy

_SPAN = 6.0  # lattice end points at ±_SPAN σ_y (thesis §6.3.1)
_PADDINGS = ("window", "full")
_SCHEMES = ("joint", "blockwise")
_MAX_CYCLES = 20  # the blockwise scheme's cycles (each a sweep over both blocks) at most


def _pow_abs(x, p):
    """|x|^p with finite derivatives in x and p at x = 0 (for p > 1)."""
    a = jnp.abs(x)
    pos = a > 0
    return jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, a, 1.0))), 0.0)


class AbstractBase(eqx.Module):
    """A family of univariate base densities q_v(v | θ) for the coordinates of v.

    Standardised (⟨v⟩ = 0, var v = 1) unless `mean` and `variance` are overridden, so A and b alone set
    q's location and scale, θ (``(D,)``, learned if `learn`) only the shape. Subclasses implement
    `init_theta`, `log_density`, `entropy` and `sample`."""

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
        """Values of θ_d tried per coordinate before optimising, each kept if it raises the bound (default none)."""
        return ()

    def to_free(self, theta):
        """The optimiser's coordinates φ of θ (default φ = θ; `from_free` inverts)."""
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
        """κ₃/κ₂^{3/2} of v_d, shape of ``theta`` (default 0; for components narrower than a lattice cell)."""
        return jnp.zeros_like(theta)


class Normal(AbstractBase):
    """Standard normal coordinates: q is N(b, AAᵀ), and AI-KL is G-KL (up to the lattice)."""

    learn: bool = eqx.field(static=True, default=False)

    def log_density(self, v, theta):
        return -0.5 * (LOG_2PI + v**2) + 0.0 * theta

    def entropy(self, theta):
        return jnp.full_like(theta, gaussian_entropy(0.0, 1))

    def sample(self, key, theta, shape):
        return jax.random.normal(key, tuple(shape) + theta.shape, theta.dtype)


# In t = r √(1 + ν²) both factors of 2 N(r) Φ(νr) log Φ(νr) vary on scales ≥ 1 and decay by |t| = 12.
_SN_GRID = np.linspace(-12.0, 12.0, 121)


def _skew_constants(nu):
    delta = nu / jnp.sqrt(1.0 + nu**2)
    mu = delta * math.sqrt(2.0 / math.pi)
    sigma = jnp.sqrt(1.0 - mu**2)
    return delta, mu, sigma


class SkewNormal(AbstractBase):
    """Standardised skew-normal coordinates v = (z − μ_ν)/σ_ν, z ~ 2 N(z) Φ(νz), θ_d = ν_d.

    The bound is stationary at ν = 0 (skewness ∝ ν³), so the fit first tries ν_d = ±`probe` per coordinate.

    **Arguments:** `probe` (default 2.0; 0 disables the probes), `learn` (default True), `max_nu`
    (default 16, the largest |ν| reached: sharper skew-normals are finer than a K = 64 lattice resolves)."""

    probe: float = eqx.field(static=True, default=2.0)
    learn: bool = eqx.field(static=True, default=True)
    max_nu: float = eqx.field(static=True, default=16.0)

    def __check_init__(self):
        if not (float(self.max_nu) > abs(float(self.probe))):
            raise ValueError(f"SkewNormal: `max_nu` must exceed |probe| ({self.probe!r}), got {self.max_nu!r}.")

    def probes(self):
        return (float(self.probe), -float(self.probe)) if self.probe else ()

    # ν's Fisher information is ≈ 0.9 (1 + |ν|)⁻³ for |ν| ≳ 4; φ ∝ sign(ν)(1 − (1 + |ν|)^{−1/2}) has about
    # constant information and is linear at 0. φ ∈ [−1, 1] maps onto |ν| ≤ `max_nu`.
    def _free_scale(self):
        return 1.0 - 1.0 / math.sqrt(1.0 + float(self.max_nu))

    def to_free(self, theta):
        return jnp.sign(theta) * (1.0 - jax.lax.rsqrt(1.0 + jnp.abs(theta))) / self._free_scale()

    def from_free(self, free):
        # |φ| beyond 1 folds back rather than clipping, which would leave a zero gradient past the cap.
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
        return gaussian_entropy(0.0, 1) - math.log(2.0) - expected - jnp.log(sigma)

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

    GN(r | η) = η / (2 s Γ(1/η)) exp(−|r/s|^η), s² = Γ(1/η)/Γ(3/η) (var = 1); η ≤ 1 makes the bound
    non-differentiable.

    **Arguments:** `eta` (starting or fixed η > 1; default 1.5), `learn` (one η per coordinate,
    θ_d = log(η_d − 1); default False)."""

    eta: float = 1.5
    learn: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        eta = np.asarray(self.eta)
        if eta.ndim != 0 or not np.isfinite(eta) or eta <= 1.0:
            raise ValueError(f"GeneralisedNormal: `eta` must be a scalar > 1 (η ≤ 1 makes the AI-KL bound "
                             f"non-differentiable), got {self.eta!r}; use e.g. eta=1.5 for heavy tails.")

    def init_theta(self, dim, dtype):
        return jnp.full((dim,), jnp.log(jnp.asarray(self.eta, dtype) - 1.0), dtype)

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


class AIKLParams(eqx.Module):
    """Parameters of q: w = A v + b, A = ``lower @ upper``.

    `loc`: b, ``(D,)``; `theta`: the bases' shape parameters, ``(D,)``; `lower`: L and `upper`: U,
    ``(D, D)`` (entries across the diagonal ignored)."""

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


def _fft_size(dim: int, lattice_points: int, padding: str) -> int:
    atoms = dim * (lattice_points - 1) + 1
    if padding == "window":
        atoms = min(atoms, 2 * lattice_points)
    return 1 << (atoms - 1).bit_length()


_NARROW, _WIDE = 1.0, 2.0  # components' widths (in spacings) below which cumulants, above which samples


def _wide_count(dim: int, lattice_points: int, span: float) -> int:
    """At most how many of D components are wider than `_NARROW` spacings (Σ_d r_d² = ((K − 1)/(2 span))²)."""
    return min(dim, int(math.floor(((lattice_points - 1) / (2.0 * span * _NARROW)) ** 2)))


def _spectrum(parts, base, lattice_points, size, omega, count):
    """The product of the components' transforms per site, ``(N, size//2 + 1)``, centred on the mean: the
    ``count`` widest sampled, the rest (mix weight 0) as exp(−½ω² Σ s_d² + iω³ Σ κ_d s_d³ / 6)."""
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
    # u_d = α_d v_d at α_d v̄_d + Δ k has density ∝ q_v(v̄_d + Δ k / α_d); α_d ≈ 0 takes the cumulant branch.
    tiny = 1e-12 * sigma_y[:, None]
    safe_alpha = jnp.where(jnp.abs(alpha) > tiny, alpha, jnp.where(alpha < 0, -tiny, tiny))
    v = vbar[..., None] + (delta[:, None, None] * offsets) / safe_alpha[..., None]  # (N, M, K)
    log_w = base.log_density(v, theta[..., None])
    pi = jax.nn.softmax(log_w, axis=-1)
    # Centred on the mean: points k ≥ centre at cyclic indices 0, 1, …, those below at the end.
    padded = jnp.concatenate([pi[..., centre:], jnp.zeros(pi.shape[:-1] + (size - K,), pi.dtype), pi[..., :centre]],
                             axis=-1)
    sampled = jnp.fft.rfft(padded, axis=-1)  # (N, M, size//2 + 1)
    ws = scale[..., None] * omega  # (N, M, F)
    # log φ(−ω) = −iωκ₁ − ½ω²κ₂ + iω³κ₃/6 (κ₁ = 0 here); real for a base without skewness.
    cumulant = jnp.exp(-0.5 * ws**2)
    if skewed:
        cumulant = cumulant * jnp.exp(1j * kappa[..., None] * ws**3 / 6.0)
    mix = jnp.clip((jnp.abs(scale) - _NARROW) / (_WIDE - _NARROW), 0.0, 1.0)[..., None]
    mix = mix * mix * (3.0 - 2.0 * mix)  # smoothstep
    spectrum = jnp.prod(mix * sampled + (1.0 - mix) * cumulant, axis=-2)  # (N, size//2 + 1)
    if log_rest is not None:
        spectrum = spectrum * jnp.exp(log_rest)
    return spectrum


def _site_lattice(projection, offset, params, base, lattice_points, padding, span):
    """Atoms and weights ρ (summing to one), each ``(N, P)``, of y_n = h_nᵀw + c_n = α_nᵀv + β_n, α_n = Aᵀh_n.

    u_d = α_d v_d, r_d spacings wide, enters by the DFT of its lattice density where r_d ≥ 2, by its
    cumulant transform where r_d ≤ 1 (exact mean, variance and skewness), and by a smooth mix between."""
    alpha = jax.vmap(projection.mv, in_axes=1, out_axes=1)(params.A)  # H A, (N, D)
    beta = projection.mv(params.loc) + offset
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
        # Where no site has more than half of `count` wide, the smaller selection gives the same value.
        small = max(1, count // 2)
        most = jnp.max(jnp.sum(jnp.abs(scale) > _NARROW, axis=-1))
        # Rematerialised, so both branches' residuals are their shared inputs (not zero-filled arrays).
        branch = lambda c: jax.checkpoint(partial(spectrum_of, c))
        spectrum = jax.lax.cond(most <= small, branch(small), branch(count), parts)
    else:
        spectrum = spectrum_of(count, parts)
    rho = jnp.fft.irfft(spectrum, n=size, axis=-1)  # cyclic index = Σ_d k_d mod size, the mean at 0
    rho = jnp.roll(rho, size // 2, axis=-1)
    atoms = shift[:, None] + delta[:, None] * (jnp.arange(size, dtype=alpha.dtype) - size // 2)
    return atoms, rho


def _expect(potential, atoms, rho):
    """Σ_j ρ_nj log φ_n(atom_nj), ``(N,)``, plus J q_y(c) Δ² B₂(θ)/2 at each kink c of log φ (Euler–Maclaurin)."""
    values = jax.vmap(potential.log_phi, in_axes=1, out_axes=1)(atoms)
    floor = 64 * jnp.finfo(rho.dtype).eps * jnp.max(rho, axis=-1, keepdims=True)
    keep = rho > floor
    out = jnp.sum(jnp.where(keep, rho * jnp.where(keep, values, 0.0), 0.0), axis=-1)
    num, size = atoms.shape
    delta, first = atoms[:, 1] - atoms[:, 0], atoms[:, 0]
    slope = lambda x: jax.jvp(potential.log_phi, (x,), (jnp.ones_like(x),))[1]
    for centre, width in potential._peaks():
        centre, width = (jnp.broadcast_to(jnp.asarray(x, atoms.dtype), (num,)) for x in (centre, width))
        jump = slope(centre + 1e-6 * width) - slope(centre - 1e-6 * width)  # f'(c⁺) − f'(c⁻) of f = log φ
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
    """⟨log φ_n(h_nᵀw + c_n)⟩ under q for every site: one ``(N_g,)`` array per site group (lattice as `bound`)."""
    lattices = (_site_lattice(g.projection, g.offset, params, base, lattice_points, padding, span) for g in model.sites)
    return tuple(_expect(group.potential, *lattice) for group, lattice in zip(model.sites, lattices))


def bound(params: AIKLParams, model: LatentLinearModel, base: AbstractBase, lattice_points: int = 256,
          padding: str = "window", span: float = _SPAN):
    """The AI-KL bound on log Z at ``params`` (differentiable). The site terms use a K = ``lattice_points``
    lattice over ±``span`` σ_y (``padding``: ``"window"`` transforms the ≥ 2K atoms nearest y's mean,
    ``"full"`` all D(K − 1) + 1); the rest is exact."""
    value = params.logdet() + jnp.sum(base.entropy(params.theta))
    if model.prior is not None:
        mean, C = _moments(params, base)
        value = value + model.prior.log_density(mean) - 0.5 * model.prior.trace_gram(C)
    for expected in site_expectations(params, model, base, lattice_points, padding, span):
        value = value + jnp.sum(expected)
    return value


def lattice_densities(params: AIKLParams, base: AbstractBase, H, offset=0.0, lattice_points: int = 256,
                      padding: str = "window", span: float = _SPAN):
    """The lattice densities of y = H w + offset under q, ``(points, density)``, each ``(N, P)``.
    ``H``: ``(N, D)`` array, BCOO or projection."""
    atoms, rho = _site_lattice(as_projection(H), offset, params, base, lattice_points, padding, span)
    return atoms, rho / (atoms[:, 1:2] - atoms[:, 0:1])


class AIKLInfo(eqx.Module):
    """What `vj.AIKL` reports beyond the common `Diagnostics` (``post.diagnostics.info``).

    `lattice_points`: the K of ``log_z``; `lattice_change`: |B(K) − B(K/2)| there; `gaussian_log_z`: the
    G-KL bound at the starting Gaussian; `start_log_z`: the AI-KL bound at the start, on ``log_z``'s lattice."""

    lattice_points: jax.Array
    lattice_change: jax.Array
    gaussian_log_z: jax.Array
    start_log_z: jax.Array

    def __repr__(self):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(self)):
            return super().__repr__()
        return (f"AIKLInfo(lattice_points={int(self.lattice_points)}, lattice_change={float(self.lattice_change):.3g}, "
                f"gaussian_log_z={float(self.gaussian_log_z):.6g}, start_log_z={float(self.start_log_z):.6g})")


class AIKLState(eqx.Module):
    """The State of `vj.AIKL`: (b, L, U, θ), whether to probe θ first and the base's class name."""

    params: AIKLParams
    probe: jax.Array
    base: str = eqx.field(static=True)


class AIKLPosterior(Posterior):
    """A `Posterior` for AI-KL, q(w) the density of A v + b: ``mean``, ``covariance``, ``marginals(H)`` are
    q's exact moments; ``params`` (also in ``state``): (b, L, U, θ)."""

    params: AIKLParams
    base: AbstractBase
    lattice_points: int = eqx.field(static=True)
    padding: str = eqx.field(static=True)
    span: float = eqx.field(static=True)

    def __init__(self, params, base, lattice_points, padding, span, log_z, diagnostics, model):
        mean, C = _moments(params, base)
        S = C.T @ C
        factor = CholeskyFactor.from_matrix(jnp.linalg.cholesky(0.5 * (S + S.T)).T)
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
        """`lattice_densities` of H w + offset; ``lattice_points`` defaults to the K of ``log_z``."""
        K = self.lattice_points if lattice_points is None else int(lattice_points)
        return lattice_densities(self.params, self.base, H, offset, K, self.padding, self.span)


class AIKL(AbstractMethod):
    """Affine-independent KL inference: maximise `bound` over (L, U, b, θ).

    **Arguments:**

    - `base`: `SkewNormal()` (default; learned skewness per coordinate), `Normal()` (q Gaussian:
      G-KL), `GeneralisedNormal(eta)`, or any `AbstractBase`.
    - `lattice_points`: K during the fit (default 64: lattice error below 10⁻³ at a quarter of K = 256's cost).
    - `solver`: default `LBFGS(tol=1e-6, max_iter=1000, gain_tol=tol_k)`.
    - `padding`: ``"window"`` (default) or ``"full"`` (`bound`); `span`: end points at ±span σ_y (default 6).
    - `tol_k`: the final bound is re-evaluated at 2K, 4K, … (at most `max_doublings` times, default 4) until
      it changes by less than this (default 1e-3); below the start's, the start is returned (`FELL_BACK`).
    - `scheme`: ``"joint"`` (default, faster) or ``"blockwise"``: (L, b, θ), then (U, b, θ), until a cycle
      gains less than ``tol_k / 100``, after 20 cycles, or at the solver's `max_iter`.

    Returns an `AIKLPosterior`; ``log_z`` is at least G-KL's for a family with the Gaussian (the cold start)."""

    base: AbstractBase = SkewNormal()
    lattice_points: int = eqx.field(static=True, default=64)
    solver: AbstractSolver | None = None
    padding: str = eqx.field(static=True, default="window")
    span: float = eqx.field(static=True, default=_SPAN)
    tol_k: float = 1e-3
    max_doublings: int = eqx.field(static=True, default=4)
    scheme: str = eqx.field(static=True, default="joint")

    def __check_init__(self):
        if not isinstance(self.base, AbstractBase):
            raise ValueError(f"AIKL: `base` must be a vj.aikl base such as vj.aikl.SkewNormal(), got "
                             f"{type(self.base).__name__}.")
        _checks.integer("lattice_points", self.lattice_points, "AIKL", 8)
        _checks.integer("max_doublings", self.max_doublings, "AIKL", 0)
        for name, allowed in (("scheme", _SCHEMES), ("padding", _PADDINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"AIKL: `{name}` must be one of {allowed}, got {getattr(self, name)!r}.")
        if self.solver is not None and not isinstance(self.solver, AbstractSolver):
            raise ValueError(f"AIKL: `solver` must be a vj.solvers solver such as vj.solvers.LBFGS(), got "
                             f"{type(self.solver).__name__}.")
        if not (float(self.span) >= 3.0):
            raise ValueError(f"AIKL: `span` must be at least 3 (lattice end points at ±span σ_y), got {self.span!r}.")
        if not (float(self.tol_k) > 0):
            raise ValueError(f"AIKL: `tol_k` must be positive, got {self.tol_k!r}.")

    def _solver(self):
        return self.solver if self.solver is not None else LBFGS(tol=1e-6, max_iter=1000, gain_tol=self.tol_k)

    def init_state(self, model) -> "AIKLState":
        gkl = GKL()
        post = gkl.solve(model, gkl.init_state(model))
        return self.from_gaussian(model, post.mean, post.factor)

    def from_gaussian(self, model, mean, factor) -> "AIKLState":
        """The bases at their Gaussian member, q with the Gaussian's moments: A = chol(S) diag(1/sd v), b = m − A⟨v⟩."""
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

    def _bound(self, params, model, lattice_points=None):
        K = self.lattice_points if lattice_points is None else lattice_points
        return bound(params, model, self.base, K, self.padding, self.span)

    def _probe(self, start, model):
        """θ after trying each of the base's probe values in each coordinate in turn, keeping improvements."""
        probes = jnp.asarray(self.base.probes(), start.theta.dtype)
        value = lambda theta: self._bound(eqx.tree_at(lambda p: p.theta, start, theta), model)

        # One scan over (coordinate, value) trials, the first the start itself, so the bound is traced once.
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
        base, dim = self.base, frozen.dim
        # Coordinates relative to the start: lower = L₀(I + strict(X)), loc = b₀ + L₀c, upper = U, θ.
        L0 = jnp.tril(start.lower)
        strict = jnp.tril(jnp.ones((dim, dim), bool), -1)
        upper_mask = jnp.triu(jnp.ones((dim, dim), bool))

        def as_params(z):  # (X, U, c), and θ's free coordinates where learned
            X, U, c, *free = z
            return AIKLParams(start.loc + L0 @ c, L0 + L0 @ jnp.where(strict, X, 0.0), jnp.where(upper_mask, U, 0.0),
                              base.from_free(free[0]) if base.learn else start.theta)

        z0 = (jnp.zeros((dim, dim), L0.dtype), jnp.triu(start.upper), jnp.zeros((dim,), L0.dtype))
        if base.learn:
            theta0 = start.theta
            if base.probes():
                theta0 = jax.lax.cond(probe, lambda: self._probe(start, frozen), lambda: start.theta)
            z0 = z0 + (base.to_free(theta0),)
        x0, unravel = ravel_pytree(z0)
        objective = lambda x: self._bound(as_params(unravel(x)), frozen)
        if self.scheme == "blockwise":
            # 1 where a coordinate of x belongs to the (L, b, θ) block, 0 where it is one of U's.
            in_lower = (jnp.ones((dim, dim)), jnp.zeros((dim, dim)), jnp.ones((dim,)), jnp.ones((dim,)))
            sol = self._blockwise(objective, x0, ravel_pytree(in_lower[:len(z0)])[0] > 0.5)
        else:
            sol = self._solver().maximise(objective, x0)
        return sol, jax.lax.stop_gradient(as_params(unravel(sol.x)))

    def _blockwise(self, objective, x0, in_lower):
        """The blockwise scheme: one loop of sweeps, the frozen block behind `stop_gradient`."""
        solver = self._solver()
        tol = self.tol_k / 100.0
        max_sweeps = 2 * _MAX_CYCLES
        dtype = x0.dtype
        nan = jnp.full((), jnp.nan, dtype)

        def sweep(_, s):
            x, trace, i, iters, grads, _, _, _ = s
            free = jnp.where(i % 2 == 0, in_lower, ~in_lower)
            sol = solver.maximise(lambda y: objective(jnp.where(free, y, jax.lax.stop_gradient(y))), x)
            return (sol.x, trace.at[i + 1].set(sol.value), i + 1, iters + sol.iterations,
                    grads + sol.num_grad_evals, sol.status, sol.grad_norm, sol.decrement)

        def settled(trace, i):
            return (i >= 2) & (i % 2 == 0) & (trace[i] - trace[jnp.maximum(i - 2, 0)] < tol)

        def finished(_, s):
            _, trace, i, iters, *_ = s
            return (iters >= solver.max_iter) | settled(trace, i)

        zero = jnp.array(0)
        state = (x0, jnp.full((max_sweeps + 1,), jnp.nan, dtype), zero, zero, zero, jnp.int32(Status.MAX_ITER), nan,
                 nan)
        (x, trace, i, iters, grads, status, grad_norm, decrement), _ = iterate(sweep, state, max_sweeps, finished)
        status = jnp.where((status == Status.CONVERGED) & ~settled(trace, i), Status.MAX_ITER, status)
        return Solution(x, trace[i], grad_norm, iters, status, trace, zero, grads, zero, decrement)

    def _lattices(self):
        return [self.lattice_points * 2**j for j in range(self.max_doublings + 1)]

    def _result(self, model, start, opt, sol, gaussian, index, pairs, change):
        """The posterior at the optimum, or at the start if its bound ``pairs[1]`` is higher."""
        ks = self._lattices()
        value, start_value = pairs[0], pairs[1]
        keep_start = start_value > value
        fell_back = start_value > value + self.tol_k
        opt = jax.tree_util.tree_map(lambda a, b: jnp.where(keep_start, a, b), start, opt)
        value = jnp.maximum(start_value, value)
        branches = [lambda p, m, k=k: self._bound(p, m, k) for k in ks]
        log_z = computed(value, lambda p, m, i: jax.lax.switch(i, branches, p, m), opt, model, index)
        info = AIKLInfo(lattice_points=jnp.asarray(ks)[index], lattice_change=change, gaussian_log_z=gaussian,
                        start_log_z=start_value)
        sol = sol._replace(status=jnp.where(fell_back, Status.FELL_BACK, sol.status).astype(jnp.int32))
        diagnostics = Diagnostics.from_solution(sol, method="AIKL", solver=type(self._solver()).__name__, info=info)
        return AIKLPosterior(opt, self.base, ks[-1], self.padding, self.span, log_z, diagnostics, model)

    def solve(self, model: LatentLinearModel, state: "AIKLState") -> AIKLPosterior:
        frozen = jax.lax.stop_gradient(model)
        start, probe = jax.lax.stop_gradient((state.params, state.probe))
        mean, C = _moments(start, self.base)
        gaussian = bound_at(mean, C.T @ C, frozen)
        sol, opt = self._optimise(frozen, start, probe)
        ks = self._lattices()
        pair = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), opt, start)
        pairs = jnp.stack([jax.vmap(lambda p, k=k: self._bound(p, frozen, k))(pair) for k in ks])  # (K's, 2)
        pairs = pairs.at[0, 0].set(sol.value)
        changes = jnp.abs(jnp.diff(pairs[:, 0]))
        if self.max_doublings:
            settled = changes < self.tol_k
            index = jnp.where(jnp.any(settled), jnp.argmax(settled) + 1, self.max_doublings)
            change = changes[index - 1]
        else:
            index, change = jnp.array(0), jnp.full((), jnp.nan, pairs.dtype)
        return self._result(model, start, opt, sol, gaussian, index, pairs[index], change)
