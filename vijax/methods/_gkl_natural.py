"""Full-covariance G-KL in its natural-parameter form, for any H (Challis thesis §4.2; Khan thesis ch. 3).

At the maximum of the G-KL bound over q = N(m, S), with Gaussian factor f(w) = exp(−½wᵀΛw + ηᵀw + κ),

$$
S^{-1} = \\Lambda + \\sum_g H_g^\\top \\operatorname{diag}(\\lambda_g) H_g, \\qquad
\\lambda_n = -2\\, \\partial F / \\partial \\sigma_n^2, \\qquad
F(\\mu, \\sigma^2) = \\sum_n \\langle \\log\\varphi_n(x) \\rangle_{N(\\mu_n, \\sigma_n^2)},
$$

with μ_n = h_nᵀm + b_n and σ_n² = h_nᵀSh_n. So q is searched over (m, λ): D + N numbers, where the
Cholesky parametrisation has D(D+3)/2. Since S⁻¹ − Λ = Hᵀdiag(λ)H, tr(ΛS) = D − Σ_n λ_nσ_n², and

$$
\\mathcal B(m, \\lambda) = \\tfrac D2 (1 + \\log 2\\pi) - \\tfrac12 \\log\\det S^{-1} + \\log f(m)
- \\tfrac12 \\big(D - \\textstyle\\sum_n \\lambda_n \\sigma_n^2\\big) + F(\\mu, \\sigma^2).
$$

**Gradient and curvature.** With g = ∇_m B, λ* = −2∂F/∂σ² at q, d = λ* − λ, A = Σ∘Σ (Σ = HSHᵀ, so
∂σ²/∂λ = −A), C = diag(∂λ*/∂σ²) and E = diag(∂λ*/∂μ) (1-D derivatives of the site expectations, in
forward mode), B's gradient is (g, ½Ad) and its negative Hessian, up to terms that vanish with d,

$$
\\begin{pmatrix} P^* & -\\tfrac12 H^\\top E A \\\\ -\\tfrac12 A E H & \\tfrac12 (A + ACA) \\end{pmatrix},
\\qquad P^* = \\Lambda + H^\\top \\operatorname{diag}(\\lambda^*) H
$$

(−∂²F/∂μ² = λ*: P* is the exact curvature in m for fixed S).

**Steps**, each along a direction (Δm, Δλ) with the step t halved until B does not fall (beyond its
rounding), so B rises every iteration:

- *natural gradient*: Δm = P*⁻¹g and Δλ = d, the fixed-point update of λ (thesis eq. 3.61) with a
  Newton step in m: exact in one step when every site is Gaussian, but linear in general, at rate ½
  where q is wide (λ* ∝ 1/σ there) and slower where λ* moves with μ;
- *Newton*: eliminating Δλ = G⁻¹(d + EHΔm), G = I + CA, leaves (Λ + HᵀWH)Δm = g + ½HᵀEAG⁻¹d with
  W = diag(λ*) − ½EAG⁻¹E. With A in full this converges quadratically; the primal form (below) keeps
  A's diagonal, σ⁴, for O(N) work beside its D × D factorisation, and converges superlinearly.

The dual form starts with natural-gradient steps, about a sixth of the cost of a Newton step there, and
takes Newton's once they contract by less than 10× a step; the primal form always takes its Newton
step. The natural-gradient step stands in wherever Newton's is no ascent direction or would make some
λ negative (in the primal form at D ≤ 32 it is Newton's computation with E = C = 0, so the program holds one
copy: where Newton's step fails, the point is taken again with that step). For log-concave sites λ* ≥ 0, so
every λ(t) is non-negative and S(t) positive definite. The site derivatives are each potential's
`expected_log_phi_derivatives` (closed forms for the logistic sigmoid).

**Stopping.** On the decrement ∇Bᵀ(Δm, Δλ) (≈ twice the gain left, invariant to the units of the
covariates; A by its diagonal in the primal form): after a quadratically convergent step, at ``tol``
or B's rounding; otherwise at ``tol²`` (it is computed from gradients, so it resolves far below B's
rounding), or where it stops falling below ``tol``. That last step is taken.

**Linear algebra** (never an inverse of an ill-conditioned matrix). A dense Gaussian factor N(μ, LLᵀ)
(a GP prior) is whitened first (w = μ + Lw̃: Λ = I); otherwise Λ is the factor's own precision (diagonal,
dense or singular, or zero without a Gaussian term). Then, with N sites in all:

- *primal* (N > D, or a Λ that is not diagonal): the D × D matrix S⁻¹, scaled to unit diagonal before
  its Cholesky factorisation; σ² from C = R⁻¹ (S = CᵀC); O(N D² + D³) a step;
- *dual* (N ≤ D and Λ = diag(p), e.g. GP models, where H = I): the N × N matrix
  B = I + Λ_λ½ K̃ Λ_λ½ with K̃ = HΛ⁻¹Hᵀ formed once, S = Λ⁻¹ − Λ⁻¹HᵀΛ_λ½B⁻¹Λ_λ½HΛ⁻¹ by Woodbury,
  σ² = diag K̃ − ‖L_B⁻¹Λ_λ½K̃‖² by columns; O(N³ + ND) a step. With H = I this is the GP site form of
  Khan, Mohamed & Murphy (2012) (V⁻¹ = K⁻¹ + diag λ).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, lu_factor, lu_solve, solve_triangular

from ..covariance import CholeskyFactor
from .._linalg import inverse_factor, nan_trace, reversed_cholesky, select
from ..model import LatentLinearModel
from ..posterior import Diagnostics
from ._gaussian import diagonal_form

__all__ = ["applies", "fit", "fixed_point_precisions", "is_state", "NaturalFit", "site_bound", "covariance_from_lambda"]

_MAX_HALVINGS = 30
_ROUNDING = 4  # B is known to a few ulps: a fall within that is no evidence against a step
_SLOW = 0.1  # a decrement ratio above this: natural-gradient steps are slow, Newton's take over (dual)
_STALLED = 0.9  # ... and above this, below B's rounding: progress is lost in rounding
_MAX_EVALS_PER_ITER = 5  # a cap on the points evaluated, whatever the steps
_LOW_RANK_MAX_DIM = 32  # the primal form's Newton step has Σ∘Σ exactly up to this D (K = D(D+1)/2 = 528)
_DISTRUST = 4  # halvings after which a Newton step (its slope estimated) gives way to the natural gradient


def applies(model: LatentLinearModel) -> bool:
    """Whether every site group's potential has a concave Gaussian expectation (`concave_expectation`,
    implied by log-concavity): then λ* = −∂²F/∂μ² ≥ 0 and every step is proper."""
    return all(bool(g.potential.concave_expectation) for g in model.sites)


def is_state(state, model: LatentLinearModel) -> bool:
    """Whether ``state`` (a `Posterior.state`) holds λ for ``model``'s site groups."""
    return (isinstance(state, tuple) and len(state) == len(model.sites)
            and all(isinstance(s, jax.Array) and s.shape == (g.num_sites,) for s, g in zip(state, model.sites)))


# ---------------------------------------------------------------------------------------- sites


class _SiteDerivatives(NamedTuple):
    """F and its derivatives at the site marginals (all sites stacked; each elementwise)."""

    value: jax.Array  # F, a scalar
    mean: jax.Array  # ∂F/∂μ
    target: jax.Array  # λ* = −2 ∂F/∂σ²
    target_var: jax.Array  # ∂λ*/∂σ²
    target_mean: jax.Array  # ∂λ*/∂μ


def _site_derivatives(model, quadrature, means, variances) -> _SiteDerivatives:
    """At the site marginals (``means``, ``variances``: one array per group), each group's potential's
    `expected_log_phi_derivatives` (closed forms where it has them, else forward mode), all sites stacked."""
    parts = [g.potential.expected_log_phi_derivatives(mu, v, quadrature) for g, mu, v in zip(model.sites, means, variances)]
    value, mean, var, mean_var, var_var = (jnp.concatenate(x) for x in zip(*parts))
    return _SiteDerivatives(jnp.sum(value), mean, -2.0 * var, -2.0 * var_var, -2.0 * mean_var)


def fixed_point_precisions(model: LatentLinearModel, means, variances, quadrature):
    """λ* = max(−2 ∂F/∂σ², 0) at site marginals (``means``, ``variances``; one array per group): the
    site precisions a Gaussian with these marginals implies, where a warm start from it begins."""
    target = _site_derivatives(model, quadrature, tuple(means), tuple(variances)).target
    return _split(jnp.maximum(target, 0.0), _sizes(model))


def _sizes(model):
    return tuple(g.num_sites for g in model.sites)


def _split(x, sizes):
    """All sites stacked → one array per group."""
    return tuple(jnp.split(x, list(itertools.accumulate(sizes[:-1])))) if len(sizes) > 1 else (x,)


def site_bound(logdet_precision, lam, variances, log_f, dim: int, expected):
    """The G-KL bound at q = N(m, S) with S⁻¹ = Λ + Hᵀdiag(λ)H (module docstring), from its pieces:

        B = D/2 (1 + log 2π) − ½ log det S⁻¹ + log f(m) − ½ (D − λᵀσ²) + F,

    ``logdet_precision`` = log det S⁻¹, ``lam`` and ``variances`` (σ_n² = h_nᵀSh_n) all sites stacked,
    ``log_f`` = log f(m), ``dim`` = D, ``expected`` = F = Σ_n ⟨log φ_n⟩. Shared with the site-form
    baselines of ``benchmarks/baselines``."""
    log_const = 0.5 * dim * (1.0 + math.log(2 * math.pi))
    return log_const - 0.5 * logdet_precision + log_f - 0.5 * (dim - lam @ variances) + expected


def covariance_from_lambda(work: LatentLinearModel, lam):
    """``(C, variances, log det S⁻¹)`` for S⁻¹ = Λ + Hᵀdiag(λ)H of ``work`` (``lam``: all sites stacked):
    S = CᵀC with C upper-triangular, σ² of every site, by one reversed Cholesky factorisation of S⁻¹
    scaled to unit diagonal (the primal form; valid for any λ that keeps S⁻¹ positive definite, NaN
    otherwise)."""
    fac = _Primal(work).factor(lam)
    return fac.core, fac.variances, fac.logdet


# ------------------------------------------------------------------------------- linear algebra


class _Factor(NamedTuple):
    """S(λ) factorised: log det S⁻¹, the site variances σ² (all sites) and what the backend's `solve` needs."""

    logdet: jax.Array
    variances: jax.Array
    core: jax.Array  # primal: C with S = CᵀC (upper-triangular); dual: the Cholesky factor of B
    root: jax.Array  # dual: √λ; primal: unused
    cross: jax.Array  # dual: L_B⁻¹ Λ_λ½ K̃, so that Σ = HSHᵀ = K̃ − crossᵀcross; primal: unused


class _Linear:
    """What both forms share: the sites as one stacked projection of the working model."""

    dense_coupling: bool

    def __init__(self, model: LatentLinearModel):
        self.model = model  # in the working coordinates

    def project(self, v):
        return jnp.concatenate([g.projection.mv(v) for g in self.model.sites])

    def project_t(self, y):
        return sum(g.projection.rmv(y_g) for g, y_g in zip(self.model.sites, _split(y, _sizes(self.model))))


class _Primal(_Linear):
    """S⁻¹ = Λ + Hᵀdiag(λ)H as a D × D matrix; A = Σ∘Σ by its diagonal σ⁴."""

    dense_coupling = False

    def precision_plus(self, weights):
        """Λ + Hᵀdiag(weights)H, dense and symmetric."""
        prior, d = self.model.prior, self.model.dim
        P = prior.precision_matrix().astype(weights.dtype) if prior is not None else jnp.zeros((d, d), weights.dtype)
        for group, w in zip(self.model.sites, _split(weights, _sizes(self.model))):
            P = P + group.projection.gram(w)
        return 0.5 * (P + P.T)

    def _cholesky(self, weights):
        """``(C, log det P)`` with P⁻¹ = CᵀC, P = Λ + Hᵀdiag(weights)H scaled to unit diagonal before its
        Cholesky factorisation (covariates in metres and in kilometres factorise alike); NaN where P is
        not positive definite."""
        P = self.precision_plus(weights)
        scale = 1.0 / jnp.sqrt(jnp.diag(P))
        R = reversed_cholesky(scale[:, None] * P * scale[None, :])  # = RRᵀ, R upper
        return inverse_factor(R, jnp.diag(scale)), 2 * jnp.sum(jnp.log(jnp.diag(R) / scale))

    def factor(self, lam) -> _Factor:
        C, logdet = self._cholesky(lam)
        factor = CholeskyFactor(C)
        variances = jnp.concatenate([factor.projected_variances(g.projection) for g in self.model.sites])
        empty = jnp.zeros((0,), C.dtype)
        return _Factor(logdet, variances, C, empty, empty)

    def solve(self, fac: _Factor, g):
        """S g."""
        return fac.core.T @ (fac.core @ g)

    def solve_weighted(self, weights, r):
        """(Λ + Hᵀdiag(weights)H)⁻¹ r (``weights`` an (N,) vector: the diagonal W of Newton's step)."""
        C, _ = self._cholesky(weights)
        return C.T @ (C @ r)

    def coupling(self, fac: _Factor, slope):
        """Σ∘Σ exactly (low rank) for D ≤ 32, else by its diagonal."""
        d = self.model.dim
        if d > _LOW_RANK_MAX_DIM:
            return _DiagonalCoupling(fac.variances**2, slope)
        T = self.project(fac.core.T)  # Σ = TTᵀ
        i, j = jnp.triu_indices(d)
        weight = jnp.where(i == j, 1.0, jnp.sqrt(2.0)).astype(T.dtype)
        return _LowRankCoupling(T[:, i] * T[:, j] * weight, slope)

    def solve_matrix(self, P, r):
        """P⁻¹ r for a symmetric D × D matrix P (scaled to unit diagonal first; NaN unless positive definite)."""
        scale = 1.0 / jnp.sqrt(jnp.diag(P))
        R = reversed_cholesky(scale[:, None] * P * scale[None, :])
        z = solve_triangular(R, scale * r, lower=False)
        return scale * solve_triangular(R, z, lower=False, trans="T")

    def cholesky(self, fac: _Factor, lam):
        return fac.core


class _Dual(_Linear):
    """S by Woodbury through B = I + Λ_λ½ K̃ Λ_λ½ (N × N), K̃ = HΛ⁻¹Hᵀ, for Λ = diag(p); A = Σ∘Σ in full."""

    dense_coupling = True

    def __init__(self, model: LatentLinearModel, K):
        super().__init__(model)
        self.K = K  # K̃, (N, N), all groups stacked

    def _inverse_precision(self):
        return 1.0 / self.model.prior.precision_diagonal().astype(self.K.dtype)

    def _cholesky_b(self, root):
        return jnp.linalg.cholesky(jnp.eye(root.shape[0], dtype=self.K.dtype) + root[:, None] * self.K * root[None, :])

    def factor(self, lam) -> _Factor:
        root = jnp.sqrt(lam)
        L = self._cholesky_b(root)
        V = solve_triangular(L, root[:, None] * self.K, lower=True)  # L_B⁻¹ Λ_λ½ K̃
        logdet = 2 * jnp.sum(jnp.log(jnp.diag(L))) + jnp.sum(jnp.log(self.model.prior.precision_diagonal()))
        return _Factor(logdet, jnp.diag(self.K) - jnp.sum(V**2, axis=0), L, root, V)

    def solve(self, fac: _Factor, g):
        return self._woodbury(fac.core, fac.root, g)

    def _woodbury(self, L, root, g):
        """(Λ + Hᵀdiag(root²)H)⁻¹g = Λ⁻¹(g − Hᵀ diag(root) B⁻¹ diag(root) H Λ⁻¹ g), B = LLᵀ."""
        inv_p = self._inverse_precision()
        y = root * cho_solve((L, True), root * self.project(inv_p * g))
        return inv_p * (g - self.project_t(y))

    def solve_weighted(self, weights, r):
        """(Λ + HᵀWH)⁻¹ r: ``weights`` W an (N,) vector (≥ 0: by B's Cholesky factor) or an (N, N) matrix
        (Newton's, possibly indefinite: Λ⁻¹r − Λ⁻¹HᵀW(I + K̃W)⁻¹HΛ⁻¹r, by LU)."""
        if weights.ndim == 1:
            root = jnp.sqrt(jnp.maximum(weights, 0.0))
            return self._woodbury(self._cholesky_b(root), root, r)
        inv_p = self._inverse_precision()
        T = lu_factor(jnp.eye(self.K.shape[0], dtype=self.K.dtype) + self.K @ weights)
        return inv_p * (r - self.project_t(weights @ lu_solve(T, self.project(inv_p * r))))

    def coupling(self, fac: _Factor, slope):
        return _DenseCoupling((self.K - fac.cross.T @ fac.cross) ** 2, slope)

    def cholesky(self, fac: _Factor, lam):
        return _Primal(self.model).factor(lam)[2]


def _site_covariance(model, work):
    """K̃ = H Λ⁻¹ Hᵀ in the working coordinates, all groups stacked; from the original dense prior
    where every group has one site per coordinate (a GP: K̃ = diag(s) K diag(s), no product with L)."""
    form = diagonal_form(model)
    if form is not None:
        K, _, scales = form
        s = jnp.concatenate(scales)
        return s[:, None] * jnp.tile(K, (len(scales), len(scales))) * s[None, :]
    inv_p = 1.0 / work.prior.precision_diagonal().astype(work.dtype)
    columns = [inv_p[:, None] * g.projection.rmv(jnp.eye(g.num_sites, dtype=work.dtype)) for g in work.sites]
    return jnp.concatenate([_Linear(work).project(c) for c in columns], axis=1)


def backend(model: LatentLinearModel, work: LatentLinearModel):
    """The dual form where it is cheaper and Λ is diagonal, else the primal (see the module docstring)."""
    if work.prior is not None and work.prior.diagonal_precision and sum(_sizes(work)) <= work.dim:
        return _Dual(work, _site_covariance(model, work))
    return _Primal(work)


# ---------------------------------------------------------------------------------------- steps


class _Direction(NamedTuple):
    mean: jax.Array  # Δm
    lam: jax.Array  # Δλ
    decrement: jax.Array  # ∇Bᵀ(Δm, Δλ)
    quadratic: jax.Array  # Newton's step with A in full (its decrement after the step is about its square)
    usable: jax.Array  # False: Newton's step failed here, and the point is to be taken again with the natural step


def _natural_step(lin, fac, lam, grad, site) -> _Direction:
    """Δm = P*⁻¹g, Δλ = d; the decrement with A by its diagonal σ⁴ (A in full costs what this step does)."""
    mean = lin.solve_weighted(jnp.maximum(site.target, 0.0), grad)
    gap = site.target - lam
    true = jnp.array(True)
    return _Direction(mean, gap, grad @ mean + 0.5 * jnp.sum((gap * fac.variances) ** 2), ~true, true)


def _step(newton, lin, fac, lam, grad, site) -> _Direction:
    """Newton's step where ``newton``, else the natural-gradient step, each once in the program.

    Primal form with Σ∘Σ in low rank (D ≤ 32, where compilation costs more than the run): the
    natural-gradient step is Newton's with ∂λ*/∂μ and ∂λ*/∂σ² set to 0 (G = I, W = diag(λ*)), so one
    computation serves both; where Newton's step fails, the direction is marked unusable and the loop
    takes the point again with ``newton`` False. Otherwise (a failed Newton step is common with Σ∘Σ by its
    diagonal, and an evaluation costs what a step does) the natural-gradient step stands in at once."""
    newton = jnp.asarray(newton)
    if not lin.dense_coupling and lin.model.dim <= _LOW_RANK_MAX_DIM:
        direction, ok = _newton_step(lin, fac, lam, grad, site, natural=~newton)
        return direction._replace(usable=ok | ~newton)

    def attempt():
        return _newton_step(lin, fac, lam, grad, site)

    def skip():
        zero, false = jnp.zeros((), grad.dtype), jnp.array(False)
        return _Direction(jnp.zeros_like(grad), jnp.zeros_like(lam), zero, false, false), false

    direction, ok = jax.lax.cond(newton, attempt, skip)
    return jax.lax.cond(ok, lambda: direction, lambda: _natural_step(lin, fac, lam, grad, site))


def _newton_step(lin, fac, lam, grad, site, natural=False) -> tuple[_Direction, jax.Array]:
    """Newton's step (see the module docstring) and whether it is usable (else the natural step is taken);
    with ``natural`` (traced), the natural-gradient step by the same computation (∂λ*/∂μ = ∂λ*/∂σ² = 0)."""
    gap = site.target - lam
    e = jnp.where(natural, 0.0, site.target_mean)
    target = jnp.where(natural, jnp.maximum(site.target, 0.0), site.target)
    coupling = lin.coupling(fac, jnp.where(natural, 0.0, site.target_var))
    mean = coupling.solve_mean(lin, target, e, grad + 0.5 * lin.project_t(e * coupling.apply(coupling.solve_g(gap))))
    lam_step = coupling.solve_g(gap + e * lin.project(mean))
    decrement = grad @ mean + 0.5 * gap @ coupling.apply(lam_step)
    ok = coupling.proper & jnp.all(jnp.isfinite(lam_step)) & jnp.all(jnp.isfinite(mean)) & (decrement > 0) \
        & jnp.all(lam + lam_step >= 0)
    return _Direction(mean, lam_step, decrement, jnp.array(coupling.exact), jnp.array(True)), ok


class _DenseCoupling:
    """A = Σ∘Σ as an N × N matrix (the dual form): G = I + CA by LU, W = diag(λ*) − ½EAG⁻¹E in full."""

    exact = True
    proper = jnp.array(True)

    def __init__(self, A, slope):
        self.A = A
        self.G = lu_factor(jnp.eye(A.shape[0], dtype=A.dtype) + slope[:, None] * A)

    def solve_g(self, b):
        return lu_solve(self.G, b)

    def apply(self, x):
        return self.A @ x

    def solve_mean(self, lin, target, e, r):
        return lin.solve_weighted(jnp.diag(target) - 0.5 * e[:, None] * (self.A @ self.solve_g(jnp.diag(e))), r)


class _LowRankCoupling:
    """A = UUᵀ exactly, U (N × K) the rows t_n ⊗ t_n of Σ = TTᵀ in symmetric (vech) form, K = D(D+1)/2: for
    small D (the primal form). G⁻¹ = I − CUQ⁻¹Uᵀ and AG⁻¹ = UQ⁻¹Uᵀ with Q = I + UᵀCU (K × K), so the m
    system is the D × D matrix Λ + Hᵀdiag(λ*)H − ½ZQ⁻¹Zᵀ, Z = HᵀEU."""

    exact = True
    proper = jnp.array(True)

    def __init__(self, U, slope):
        self.U, self.slope = U, slope
        self.Q = lu_factor(jnp.eye(U.shape[1], dtype=U.dtype) + U.T @ (slope[:, None] * U))

    def solve_g(self, b):
        return b - self.slope * (self.U @ lu_solve(self.Q, self.U.T @ b))

    def apply(self, x):
        return self.U @ (self.U.T @ x)

    def solve_mean(self, lin, target, e, r):
        Z = lin.project_t(e[:, None] * self.U)
        P = lin.precision_plus(target) - 0.5 * Z @ lu_solve(self.Q, Z.T)
        return lin.solve_matrix(0.5 * (P + P.T), r)


class _DiagonalCoupling:
    """A = Σ∘Σ by its diagonal σ⁴ (the primal form, large D): Newton's step in λ site by site."""

    exact = False

    def __init__(self, a, slope):
        self.a, self.G = a, 1.0 + slope * a
        self.proper = jnp.all(self.G > 0)

    def solve_g(self, b):
        return b / self.G

    def apply(self, x):
        return self.a * x

    def solve_mean(self, lin, target, e, r):
        return lin.solve_weighted(target - 0.5 * e**2 * self.a / self.G, r)


# ---------------------------------------------------------------------------------------- ascent


class _Point(NamedTuple):
    """A q = N(m, S(λ)) and the step from it."""

    mean: jax.Array
    lam: jax.Array  # all sites stacked
    fac: _Factor
    value: jax.Array
    grad: jax.Array  # ∇_m B
    gap: jax.Array  # λ* − λ
    step: _Direction
    newton: jax.Array  # whether the step was meant to be Newton's


class _State(NamedTuple):
    point: _Point  # the current point (a placeholder with value −∞ before the first)
    trial_mean: jax.Array  # the point the next iteration evaluates
    trial_lam: jax.Array
    t: jax.Array  # its step length along the current point's step
    retry: jax.Array  # the trial is the current point again, to take the natural-gradient step from it
    decrement: jax.Array  # the last decrement measured (of a full step)
    rate: jax.Array  # the ratio of the last two decrements
    k: jax.Array
    halvings: jax.Array
    done: jax.Array
    converged: jax.Array
    trace: jax.Array
    evals: jax.Array


class NaturalFit(NamedTuple):
    """What `fit` returns: q in the working coordinates (C upper-triangular, S = CᵀC), λ per group, diagnostics."""

    mean: jax.Array
    cholesky: jax.Array
    lam: tuple
    value: jax.Array  # the bound at q
    diagnostics: Diagnostics


def fit(model: LatentLinearModel, work: LatentLinearModel, mean, lam, quadrature, max_iter: int,
        tol: float) -> NaturalFit:
    """Maximise the G-KL bound of ``work`` (``model`` in the working coordinates; ``model`` itself is
    only read for a GP prior's covariance) over (m, λ) from (``mean``, ``lam``: one array per group).
    Where the bound is not finite at the start, λ is raised (λ ← 4λ + 3/σ²: each variance below a
    quarter of its value) until it is."""
    lin = backend(model, work)
    sizes = _sizes(work)
    dtype, d = work.dtype, work.dim
    eps = jnp.finfo(dtype).eps
    prior = work.prior

    def point(m, lam, fac, newton) -> _Point:
        means = _split(lin.project(m), sizes)
        means = tuple(mu + jnp.broadcast_to(g.offset, mu.shape) for mu, g in zip(means, work.sites))
        site = _site_derivatives(work, quadrature, means, _split(fac.variances, sizes))
        log_f, grad_f = jax.value_and_grad(prior.log_density)(m) if prior is not None else (0.0, 0.0)
        value = site_bound(fac.logdet, lam, fac.variances, log_f, d, site.value)
        grad = grad_f + lin.project_t(site.mean)
        step = _step(newton, lin, fac, lam, grad, site)
        return _Point(m, lam, fac, value, grad, site.target - lam, step, newton)

    lam = jnp.maximum(jnp.concatenate(lam), 0.0).astype(dtype)
    mean = mean.astype(dtype)
    # Before the first point, a placeholder of its shape (value −∞, so that any finite point replaces it).
    shapes = jax.eval_shape(lambda: point(mean, lam, lin.factor(lam), False))
    nothing = jax.tree_util.tree_map(lambda a: jnp.full(a.shape, -jnp.inf if a.dtype == dtype else 0, a.dtype), shapes)
    trace = nan_trace(max_iter, dtype)
    one, false = jnp.ones((), dtype), jnp.array(False)
    state = _State(nothing, mean, lam, one, false, jnp.array(jnp.inf, dtype), jnp.zeros((), dtype), jnp.array(0),
                   jnp.array(0), false, false, trace, jnp.array(0))

    def body(s: _State) -> _State:
        # One point per iteration of the loop (so the objective is traced once): the trial (m, λ) that the
        # last iteration chose. Accepted, it becomes the point and the next trial is its full step;
        # rejected, t is halved. Before any finite point, a non-finite start has its λ raised instead.
        p = s.point
        started = jnp.isfinite(p.value)
        # Newton's step: in the primal form always (it costs what a natural-gradient step does there), in
        # the dual once natural-gradient steps are seen to converge slowly, and from then on.
        newton = (p.newton | (s.rate > _SLOW) | (not lin.dense_coupling)) & ~s.retry
        new = point(s.trial_mean, s.trial_lam, lin.factor(s.trial_lam), newton)
        full = started & (s.t == 1) & ~s.retry
        rate = jnp.where(full, p.step.decrement / s.decrement, s.rate)
        decrement = jnp.where(full, p.step.decrement, s.decrement)
        loose = jnp.maximum(tol, _ROUNDING * eps * jnp.abs(p.value))
        strict = jnp.where(p.step.quadratic, loose, tol**2)
        last = full & ((decrement <= strict) | ((decrement <= loose) & (rate > _STALLED)))
        # B may not fall beyond its rounding; once the gain left is below what B resolves, its
        # differences are noise, and a step that lowers it by up to `loose` is taken.
        noise = jnp.where(decrement <= loose, loose, _ROUNDING * eps * jnp.abs(p.value))
        ok = jnp.isfinite(new.value) & ((new.value >= p.value - noise) | ~started | s.retry)
        p = select(ok, new, p)
        k = s.k + (ok & started & ~s.retry)
        halvings = jnp.where(ok, 0, s.halvings + 1)
        t = jnp.where(ok, one, 0.5 * s.t)
        # A Newton step whose slope was only estimated (A by its diagonal) may not rise at all: after a
        # few halvings, the point is evaluated again with the natural-gradient step, an ascent direction.
        retry = (~ok & p.newton & ~p.step.quadratic & (halvings == _DISTRUST)) | (ok & ~p.step.usable)
        t = jnp.where(retry, one, t)
        v = new.fac.variances
        raised = 4.0 * s.trial_lam + 3.0 / jnp.where(jnp.isfinite(v) & (v > 0), v, 1.0)
        # A retry takes the point itself (its Newton direction may not even be finite).
        trial_mean = jnp.where(jnp.isfinite(p.value), jnp.where(retry, p.mean, p.mean + t * p.step.mean), s.trial_mean)
        trial_lam = jnp.where(jnp.isfinite(p.value), jnp.where(retry, p.lam, p.lam + t * p.step.lam), raised)
        # Stop after the last step (kept if B allows), or when no step down to 2⁻³⁰ raises B (the bound
        # is flat to its rounding along the step: converged if the decrement says so too).
        stuck = halvings >= _MAX_HALVINGS
        return _State(p, trial_mean, trial_lam, t, retry, decrement, rate, k, halvings, last | stuck,
                      last | (stuck & (decrement <= loose)), jnp.where(ok, s.trace.at[k].set(p.value), s.trace),
                      s.evals + 1)

    s = jax.lax.while_loop(lambda s: (s.k < max_iter) & (s.evals < _MAX_EVALS_PER_ITER * max_iter) & ~s.done,
                           body, state)
    p = s.point
    grad_norm = jnp.maximum(jnp.max(jnp.abs(p.grad)), jnp.max(0.5 * jnp.abs(p.gap)))
    diagnostics = Diagnostics(iterations=s.k, converged=jnp.isfinite(p.value) & s.converged,
                              stationarity=s.decrement, grad_norm=grad_norm, objective_trace=s.trace,
                              num_value_evals=s.evals, num_grad_evals=s.evals, num_hvp_evals=0, method="GKL",
                              solver=f"natural-parameter ascent ({'dual' if lin.dense_coupling else 'primal'})")
    return NaturalFit(p.mean, lin.cholesky(p.fac, p.lam), _split(p.lam, sizes), p.value, diagnostics)
