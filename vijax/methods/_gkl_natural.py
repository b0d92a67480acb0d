"""Full-covariance G-KL in its natural-parameter form, for any H (Challis thesis §4.2; Khan thesis ch. 3).

At the maximum of the G-KL bound over q = N(m, S), with Gaussian factor f(w) = exp(−½wᵀΛw + ηᵀw + κ),

$$
S^{-1} = \\Lambda + \\sum_g H_g^\\top \\operatorname{diag}(\\lambda_g) H_g, \\qquad
\\lambda_n = -2\\, \\partial F / \\partial \\sigma_n^2, \\qquad
F(\\mu, \\sigma^2) = \\sum_n \\langle \\log\\varphi_n(x) \\rangle_{N(\\mu_n, \\sigma_n^2)},
$$

μ_n = h_nᵀm + b_n, σ_n² = h_nᵀSh_n, so q is searched over (m, λ), D + N numbers, with
B(m, λ) = H[q] + log f(m) − ½(D − Σ_n λ_n σ_n²) + F. With g = ∇_m B, d = λ* − λ (λ* = −2∂F/∂σ² at q),
A = Σ∘Σ (Σ = HSHᵀ), C = diag(∂λ*/∂σ²) and E = diag(∂λ*/∂μ), B's gradient is (g, ½Ad) and its negative Hessian,
up to terms that vanish with d,

$$
\\begin{pmatrix} P^* & -\\tfrac12 H^\\top E A \\\\ -\\tfrac12 A E H & \\tfrac12 (A + ACA) \\end{pmatrix},
\\qquad P^* = \\Lambda + H^\\top \\operatorname{diag}(\\lambda^*) H.
$$

Steps (backtracked): the natural gradient Δm = P*⁻¹g, Δλ = d (thesis eq. 3.61), or Newton's, in the *primal* form
(S⁻¹ by Cholesky) or the *dual* (N ≤ D, Λ diagonal: Woodbury through B = I + Λ_λ½ K̃ Λ_λ½, K̃ = HΛ⁻¹Hᵀ). For
log-concave sites λ* ≥ 0, so S stays positive definite. A dense Gaussian factor is whitened first (Λ = I).
"""

from __future__ import annotations

import collections
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import lu_factor, lu_solve

from .._factorisation import Primal, SiteForm
from .._linalg import gaussian_entropy, nan_trace, select
from ..model import LatentLinearModel
from ..posterior import Diagnostics
from ..solvers import Status, iterate
from ._gaussian import diagonal_form

__all__ = ["applies", "fit", "fixed_point_precisions", "NaturalFit"]

_MAX_HALVINGS = 30
_ROUNDING = 4  # B is known to a few ulps: a fall within that is no evidence against a step
_SLOW = 0.1  # a decrement ratio above this: natural-gradient steps are slow, Newton's take over (dual)
_STALLED = 0.9  # ... and above this, below B's rounding: progress is lost in rounding
_MAX_EVALS_PER_ITER = 5  # a cap on the points evaluated, whatever the steps
_DISTRUST = 4  # halvings after which a Newton step (its slope estimated) gives way to the natural gradient


def applies(model: LatentLinearModel) -> bool:
    """Whether every site's Gaussian expectation is concave (so λ* ≥ 0 and every step is proper)."""
    return all(bool(g.potential.concave_expectation) for g in model.sites)


# F (a scalar) and, at every site, ∂F/∂μ, λ* = −2 ∂F/∂σ², ∂λ*/∂σ² and ∂λ*/∂μ.
_SiteDerivatives = collections.namedtuple("_SiteDerivatives", "value mean target target_var target_mean")


def _site_derivatives(model, quadrature, means, variances) -> _SiteDerivatives:
    """`expected_log_phi_derivatives` at the site marginals (one array per group), all sites stacked."""
    parts = [g.potential.expected_log_phi_derivatives(mu, v, quadrature) for g, mu, v in zip(model.sites, means, variances)]
    value, mean, var, mean_var, var_var = (jnp.concatenate(x) for x in zip(*parts))
    return _SiteDerivatives(jnp.sum(value), mean, -2.0 * var, -2.0 * var_var, -2.0 * mean_var)


def fixed_point_precisions(model: LatentLinearModel, means, variances, quadrature):
    """λ* = max(−2 ∂F/∂σ², 0) at site marginals (one array per group): a warm start's site precisions."""
    target = _site_derivatives(model, quadrature, tuple(means), tuple(variances)).target
    return _split(jnp.maximum(target, 0.0), _sizes(model))


def _sizes(model):
    return tuple(g.num_sites for g in model.sites)


def _split(x, sizes):
    """All sites stacked → one array per group."""
    return tuple(jnp.split(x, list(itertools.accumulate(sizes[:-1])))) if len(sizes) > 1 else (x,)


def _site_bound(logdet_precision, lam, variances, log_f, dim: int, expected):
    """B = H[q] + log f(m) − ½ (D − λᵀσ²) + F from log det S⁻¹, λ, σ² (all sites), log f(m), D and F."""
    return gaussian_entropy(-logdet_precision, dim) + log_f - 0.5 * (dim - lam @ variances) + expected


# S(λ) factorised: log det S⁻¹, σ² (all sites), core (primal: C, S = CᵀC; dual: unused) and cross (primal:
# T = HCᵀ, Σ = HSHᵀ = TTᵀ; dual: L_B⁻¹ Λ_λ½ K̃, Σ = K̃ − crossᵀcross).
_Factor = collections.namedtuple("_Factor", "logdet variances core cross")


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
    """S⁻¹ = Λ + Hᵀdiag(λ)H as a D × D matrix; A = Σ∘Σ applied matrix-free through T = HCᵀ."""

    dense_coupling = False

    def __init__(self, model: LatentLinearModel):
        super().__init__(model)
        prior, d = model.prior, model.dim
        self.prior_precision = (prior.precision_matrix().astype(model.dtype) if prior is not None
                                else jnp.zeros((d, d), model.dtype))

    def precision_plus(self, weights):
        """Λ + Hᵀdiag(weights)H, dense and symmetric."""
        P = self.prior_precision.astype(weights.dtype)
        for group, w in zip(self.model.sites, _split(weights, _sizes(self.model))):
            P = P + group.projection.gram(w)
        return 0.5 * (P + P.T)

    def factor(self, lam) -> _Factor:
        """S = CᵀC from the equilibrated factorisation of S⁻¹ (`Primal`); T = HCᵀ and σ² = rowsums of T∘T."""
        precision = Primal.of(self.precision_plus(lam))
        C = precision.covariance_factor()
        T = self.project(C.T)
        return _Factor(precision.logdet(), jnp.sum(T**2, axis=1), C, T)

    def solve_weighted(self, weights, r):
        """(Λ + Hᵀdiag(weights)H)⁻¹ r (NaN unless the matrix is positive definite)."""
        return Primal.of(self.precision_plus(weights)).solve(r)


class _Dual(_Linear):
    """S by Woodbury through B = I + Λ_λ½ K̃ Λ_λ½ (N × N), K̃ = HΛ⁻¹Hᵀ, for Λ = diag(p); A = Σ∘Σ in full."""

    dense_coupling = True

    def __init__(self, model: LatentLinearModel, K):
        super().__init__(model)
        self.K = K  # K̃, (N, N), all groups stacked

    def _precision(self):
        return self.model.prior.precision_diagonal().astype(self.K.dtype)  # in the model's dtype (x64 or not)

    def factor(self, lam) -> _Factor:
        """The site form of S (`SiteForm`: B = I + Λ_λ½ K̃ Λ_λ½); σ² = diag K̃ − colsums of V∘V."""
        sites = SiteForm.of(self.K, lam)
        V = sites.cross()  # L_B⁻¹ Λ_λ½ K̃
        logdet = sites.logdet() + jnp.sum(jnp.log(self._precision()))
        return _Factor(logdet, jnp.diag(self.K) - jnp.sum(V**2, axis=0), jnp.zeros((0,), V.dtype), V)

    def solve_weighted(self, weights, r):
        """(Λ + HᵀWH)⁻¹ r: ``weights`` W an (N,) vector (≥ 0: Λ⁻¹(r − Hᵀ(K̃ + W⁻¹)⁻¹HΛ⁻¹r), by the site form)
        or an (N, N) matrix (Newton's, possibly indefinite: Λ⁻¹r − Λ⁻¹HᵀW(I + K̃W)⁻¹HΛ⁻¹r, by LU)."""
        inv_p = 1.0 / self._precision()
        if weights.ndim == 1:
            return inv_p * (r - self.project_t(SiteForm.of(self.K, weights).sites_solve(self.project(inv_p * r))))
        T = lu_factor(jnp.eye(self.K.shape[0], dtype=self.K.dtype) + self.K @ weights)
        return inv_p * (r - self.project_t(weights @ lu_solve(T, self.project(inv_p * r))))


def _site_covariance(model, work):
    """K̃ = H Λ⁻¹ Hᵀ in the working coordinates, all groups stacked (a GP's: diag(s) K diag(s))."""
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


# Δm, Δλ, the decrement ∇Bᵀ(Δm, Δλ), quadratic (as good as Newton's step) and spread (the primal form's estimate of
# the relative error of Newton's step with A by its diagonal).
_Direction = collections.namedtuple("_Direction", "mean lam decrement quadratic spread")


def _natural_step(lin, fac, lam, grad, site, spread) -> _Direction:
    """Δm = P*⁻¹g, Δλ = d; the decrement with A by its diagonal σ⁴ (A in full costs more than this step)."""
    mean = lin.solve_weighted(jnp.maximum(site.target, 0.0), grad)
    gap = site.target - lam
    return _Direction(mean, gap, grad @ mean + 0.5 * jnp.sum((gap * fac.variances) ** 2), jnp.array(False), spread)


def _step(newton, wanted, lin, fac, lam, grad, site, spread, last) -> _Direction:
    """Newton's step where ``newton`` and usable, else the natural-gradient one; zeros unless ``wanted``."""

    def attempt():
        newton_step = _dense_newton_step if lin.dense_coupling else _corrected_newton_step
        return newton_step(lin, fac, lam, grad, site, spread, last)

    def skip():
        zero = jnp.zeros((), grad.dtype)
        return _Direction(jnp.zeros_like(grad), jnp.zeros_like(lam), zero, jnp.array(False), spread), jnp.array(False)

    direction, ok = jax.lax.cond(jnp.asarray(newton) & wanted, attempt, skip)
    return jax.lax.cond(ok | ~wanted, lambda: direction, lambda: _natural_step(lin, fac, lam, grad, site, spread))


def _usable(lam, mean, lam_step, decrement):
    """A Newton step is taken where it is finite, an ascent direction and keeps every λ non-negative."""
    return jnp.all(jnp.isfinite(lam_step)) & jnp.all(jnp.isfinite(mean)) & (decrement > 0) & jnp.all(lam + lam_step >= 0)


def _dense_newton_step(lin, fac, lam, grad, site, spread, _last) -> tuple[_Direction, jax.Array]:
    """Newton's step in the dual form: A = Σ∘Σ in full, G = I + CA by LU, W = diag(λ*) − ½EAG⁻¹E in the m system."""
    gap, e = site.target - lam, site.target_mean
    A = (lin.K - fac.cross.T @ fac.cross) ** 2
    G = lu_factor(jnp.eye(A.shape[0], dtype=A.dtype) + site.target_var[:, None] * A)
    W = jnp.diag(site.target) - 0.5 * e[:, None] * (A @ lu_solve(G, jnp.diag(e)))
    mean = lin.solve_weighted(W, grad + 0.5 * lin.project_t(e * (A @ lu_solve(G, gap))))
    lam_step = lu_solve(G, gap + e * lin.project(mean))
    decrement = grad @ mean + 0.5 * gap @ (A @ lam_step)
    return _Direction(mean, lam_step, decrement, jnp.array(True), spread), _usable(lam, mean, lam_step, decrement)


_MAX_PRODUCTS = 6  # Richardson corrections (products with A) of the primal Newton step, at most
_CONTRACTION = 0.5  # a correction above this share of the last one: the iteration does not converge there
_SPREAD_START = 1.0  # the spread assumed at the first point (its step is corrected, and M's error measured)
_SPREAD_SAFETY = 2.0  # the last point's spread, times this, estimates the error of the next M⁻¹b
_FLOOR = 100  # the last step leaves an error of this many ulps (in units of q's spread), whatever Newton's would


def _corrected_newton_step(lin: _Primal, fac, lam, grad, site, spread, last) -> tuple[_Direction, jax.Array]:
    """Newton's step K x = b, x = (Δm, Δλ), in the primal form: x₀ = M⁻¹b (M: K with A by its diagonal a = σ⁴), then
    x ← x + M⁻¹(b − Kx) while x's estimated relative error exceeds `allowed`. ``spread``: x₀'s relative error at
    the last point; ``last``: the decrement below which the fit stops after this step."""
    T, a = fac.cross, fac.variances**2
    Tt = T.T  # once, not in every product
    gap, e, c, target = site.target - lam, site.target_mean, site.target_var, site.target
    G = 1.0 + c * a
    system = Primal.of(lin.precision_plus(target - 0.5 * e**2 * a / G))  # M's system in m
    floor = _FLOOR * jnp.finfo(a.dtype).eps

    def precondition(r_mean, r_lam):
        """M⁻¹(r_m, r_λ): (Λ + HᵀWH)Δm = r_m + ½HᵀEa r_λ/G with W = λ* − ½E²a/G, then Δλ = (r_λ + EHΔm)/G."""
        mean = system.solve(r_mean + 0.5 * lin.project_t(e * a * r_lam / G))
        return mean, (r_lam + e * lin.project(mean)) / G

    def size(mean, lam_step):
        """‖(Δm, Δλ)‖ in M's curvature: Δmᵀ(Λ + HᵀWH)Δm + ½Σ a Δλ², then the square root."""
        z = system.half_multiply(mean)
        return jnp.sqrt(z @ z + 0.5 * a @ lam_step**2)

    def allowed(decrement):
        """The relative error at which a step is as good as Newton's: √decrement, or what leaves ``floor``."""
        root = jnp.sqrt(jnp.maximum(decrement, 0.0))
        return jnp.maximum(root, floor / root)

    mean, lam_step = precondition(grad, gap)
    first = grad @ mean + 0.5 * gap @ (a * lam_step)  # the decrement with A by its diagonal
    wanted = jnp.where(first <= last, floor / jnp.sqrt(jnp.maximum(first, 0.0)), allowed(first))

    def body(s):
        # x = (Δm, Δλ); δ the last correction added to it (the first: x₀) and its size; Σ A δλ over the
        # corrections before δ; x's estimated relative error; x₀'s (the relative size of the first correction).
        k, mean, lam_step, d_lam, previous, coupled, _, measured = s
        product = jnp.sum((T @ (Tt @ (d_lam[:, None] * T))) * T, axis=1)  # (Σ∘Σ)δλ = diag(T(Tᵀdiag(δλ)T)Tᵀ)
        off = product - a * d_lam  # (A − diag a)δλ
        c_mean, c_lam = precondition(0.5 * lin.project_t(e * off), -c * off)
        c_size = size(c_mean, c_lam)
        contraction = c_size / previous
        new_mean, new_lam = mean + c_mean, lam_step + c_lam
        new_size = size(new_mean, new_lam)
        # A correction not well below the last (after the first): the iteration does not converge, and stops.
        converging = (k == 0) | (contraction <= _CONTRACTION)
        return (jnp.where(converging, k + 1, _MAX_PRODUCTS), jnp.where(converging, new_mean, mean),
                jnp.where(converging, new_lam, lam_step), jnp.where(converging, c_lam, 0.0), c_size,
                coupled + product, jnp.where(converging, contraction * c_size / new_size, jnp.inf),
                jnp.where(k == 0, c_size / new_size, measured))

    state = (jnp.array(0), mean, lam_step, lam_step, size(mean, lam_step), jnp.zeros_like(lam),
             _SPREAD_SAFETY * spread, spread)
    _, mean, lam_step, d_lam, _, coupled, error, spread = jax.lax.while_loop(
        lambda s: (s[0] < _MAX_PRODUCTS) & (s[6] > wanted), body, state)
    # A Δλ: the products computed, and the last correction's (not multiplied) by its diagonal.
    decrement = grad @ mean + 0.5 * gap @ (coupled + a * d_lam)
    ok = _usable(lam, mean, lam_step, decrement) & jnp.all(G > 0)
    return _Direction(mean, lam_step, decrement, error <= allowed(decrement), spread), ok


# A q = N(m, S(λ)) (λ all sites stacked), its factor, B, ∇_m B, λ* − λ, the step from it and whether the step was
# meant to be Newton's.
_Point = collections.namedtuple("_Point", "mean lam fac value grad gap step newton")


# The current point (value −∞ before the first), the next trial (m, λ) at step length t along the point's step (retry:
# the point again, for its natural-gradient step), the last full step's decrement and its ratio to the one before.
_State = collections.namedtuple("_State", "point trial_mean trial_lam t retry decrement rate k halvings done converged "
                                          "trace evals")


class NaturalFit(NamedTuple):
    """What `fit` returns: q in the working coordinates (C upper-triangular, S = CᵀC), λ per group, diagnostics."""

    mean: jax.Array
    cholesky: jax.Array
    lam: tuple
    value: jax.Array  # the bound at q
    diagnostics: Diagnostics


def fit(model: LatentLinearModel, work: LatentLinearModel, mean, lam, quadrature, max_iter: int,
        tol: float) -> NaturalFit:
    """Maximise the G-KL bound of ``work`` (``model`` in working coordinates) over (m, λ) from (``mean``, ``lam``:
    one array per group). Where the bound is not finite at the start, λ ← 4λ + 3/σ² until it is."""
    lin = backend(model, work)
    sizes = _sizes(work)
    dtype, d = work.dtype, work.dim
    eps = jnp.finfo(dtype).eps
    tol = jnp.asarray(tol, dtype)  # may be traced

    def point(m, lam, fac, newton, spread, wanted=True) -> _Point:
        means = _split(lin.project(m), sizes)
        means = tuple(mu + jnp.broadcast_to(g.offset, mu.shape) for mu, g in zip(means, work.sites))
        site = _site_derivatives(work, quadrature, means, _split(fac.variances, sizes))
        log_f, grad_f = jax.value_and_grad(work.prior.log_density)(m) if work.prior is not None else (0.0, 0.0)
        value = _site_bound(fac.logdet, lam, fac.variances, log_f, d, site.value)
        grad = grad_f + lin.project_t(site.mean)
        # A step with its decrement below `loose` is the last (see `body`).
        loose = jnp.maximum(tol, _ROUNDING * eps * jnp.abs(value))
        step = _step(newton, jnp.asarray(wanted), lin, fac, lam, grad, site, spread, loose)
        return _Point(m, lam, fac, value, grad, site.target - lam, step, newton)

    lam = jnp.maximum(jnp.concatenate(lam), 0.0).astype(dtype)
    mean = mean.astype(dtype)
    # Before the first point, a placeholder of its shape (value −∞, so that any finite point replaces it).
    shapes = jax.eval_shape(lambda: point(mean, lam, lin.factor(lam), False, jnp.ones((), dtype)))
    nothing = jax.tree_util.tree_map(
        lambda a: jnp.full(a.shape, -jnp.inf if jnp.issubdtype(a.dtype, jnp.floating) else 0, a.dtype), shapes)
    trace = nan_trace(max_iter, dtype)
    one, false = jnp.ones((), dtype), jnp.array(False)
    state = _State(nothing, mean, lam, one, false, jnp.array(jnp.inf, dtype), jnp.zeros((), dtype), jnp.array(0),
                   jnp.array(0), false, false, trace, jnp.array(0))

    def body(s: _State) -> _State:
        # One trial a pass: accepted, the next is its full step; rejected, t halved (before a finite point: λ raised).
        p = s.point
        started = jnp.isfinite(p.value)
        # Newton's step: always in the primal form, in the dual once natural-gradient steps are slow.
        newton = (p.newton | (s.rate > _SLOW) | (not lin.dense_coupling)) & ~s.retry
        full = started & (s.t == 1) & ~s.retry
        rate = jnp.where(full, p.step.decrement / s.decrement, s.rate)
        decrement = jnp.where(full, p.step.decrement, s.decrement)
        loose = jnp.maximum(tol, _ROUNDING * eps * jnp.abs(p.value))
        strict = jnp.where(p.step.quadratic, loose, tol**2)
        last = full & ((decrement <= strict) | ((decrement <= loose) & (rate > _STALLED)))
        # The trial after the last step is the answer: no step is computed from it.
        new = point(s.trial_mean, s.trial_lam, lin.factor(s.trial_lam), newton,
                    jnp.where(started, p.step.spread, _SPREAD_START), ~last)
        # B may not fall beyond its rounding (beyond `loose` once the gain left is below it).
        noise = jnp.where(decrement <= loose, loose, _ROUNDING * eps * jnp.abs(p.value))
        ok = jnp.isfinite(new.value) & ((new.value >= p.value - noise) | ~started | s.retry)
        p = select(ok, new, p)
        k = s.k + (ok & started & ~s.retry)
        halvings = jnp.where(ok, 0, s.halvings + 1)
        t = jnp.where(ok, one, 0.5 * s.t)
        # A Newton step whose slope was only estimated may not rise: after a few halvings, the natural gradient.
        estimated = ~p.step.quadratic | (not lin.dense_coupling)
        retry = ~ok & p.newton & estimated & (halvings == _DISTRUST)
        t = jnp.where(retry, one, t)
        v = new.fac.variances
        raised = 4.0 * s.trial_lam + 3.0 / jnp.where(jnp.isfinite(v) & (v > 0), v, 1.0)
        # A retry takes the point itself (its Newton direction may not even be finite).
        trial_mean = jnp.where(jnp.isfinite(p.value), jnp.where(retry, p.mean, p.mean + t * p.step.mean), s.trial_mean)
        trial_lam = jnp.where(jnp.isfinite(p.value), jnp.where(retry, p.lam, p.lam + t * p.step.lam), raised)
        # Stop after the last step, or when no step down to 2⁻³⁰ raises B (converged if the decrement is loose).
        stuck = halvings >= _MAX_HALVINGS
        return _State(p, trial_mean, trial_lam, t, retry, decrement, rate, k, halvings, last | stuck,
                      last | (stuck & (decrement <= loose)), jnp.where(ok, s.trace.at[k].set(p.value), s.trace),
                      s.evals + 1)

    cap = _MAX_EVALS_PER_ITER * max_iter  # points evaluated, one per pass
    s, _ = iterate(lambda _, s: body(s), state, cap, lambda _, s: (s.k >= max_iter) | (s.evals >= cap) | s.done)
    p = s.point
    grad_norm = jnp.maximum(jnp.max(jnp.abs(p.grad)), jnp.max(0.5 * jnp.abs(p.gap)))
    status = Status.of(s.converged, value=p.value, stalled=s.done & ~s.converged)
    diagnostics = Diagnostics(iterations=s.k, status=status, stationarity=s.decrement, grad_norm=grad_norm,
                              objective_trace=s.trace, num_value_evals=s.evals, num_grad_evals=s.evals, num_hvp_evals=0,
                              method="GKL",
                              solver=f"natural-parameter ascent ({'dual' if lin.dense_coupling else 'primal'})")
    cholesky = _Primal(work).factor(p.lam).core if lin.dense_coupling else p.fac.core
    return NaturalFit(p.mean, cholesky, _split(p.lam, sizes), p.value, diagnostics)
