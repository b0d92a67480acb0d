"""Local variational bounds (LVB): every site bounded below by an exponentiated quadratic, integrated in closed form.

With log φ_n(x) ≥ a_n(ξ_n) x − ½ A_n(ξ_n) x² + c_n(ξ_n) (x = hᵀw + b) and f(w) = exp(−½wᵀΛw + ηᵀw + κ),

$$
\\log Z \\ge \\mathcal B_{\\rm LVB}(\\xi) = \\kappa + \\sum_n (a_n b_n - \\tfrac12 A_n b_n^2 + c_n)
+ \\tfrac12 r^\\top P^{-1} r + \\tfrac D2 \\log 2\\pi - \\tfrac12 \\log\\det P,

P = \\Lambda + \\sum_n A_n h_n h_n^\\top, \\qquad r = \\eta + \\sum_n (a_n - A_n b_n) h_n
$$

(thesis eq. 3.8.4, its constant corrected), below the G-KL bound at q_ξ = N(P⁻¹r, P⁻¹) (thesis §4.4.1). Alternating
q ← q_ξ and ξ ← its closed-form optimum given q is EM. ``xi``: one ``(N_g,)`` array per site group (None: Gaussian).
"""

from __future__ import annotations

import abc
import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _checks
from .. import potentials as pot
from .._linalg import LOG_2PI, nan_trace, pcg, ritz_pairs
from ..covariance import CholeskyFactor, DiagonalFactor, SubspaceFactor
from ..model import LatentLinearModel
from ..posterior import Diagnostics, LVBInfo, Posterior
from ..solvers import FixedPoint, Status, fixed_point, iterate
from ._base import AbstractMethod, same_shapes
from ._gaussian import integrate, marginals, precision_operator, working_model
from ..start import expand_at_mode

__all__ = ["LVB", "LVBState", "bound", "gaussian", "update", "local_bound", "covariance_solve",
           "AbstractLocalBound", "Jaakkola", "Bohning", "ScaleMixture", "Exact", "MaskedBound"]
__dir__ = __all__.copy

BOUNDS = ("jaakkola", "bohning")
VARIANCES = ("exact", "lanczos")
_NUM_PROBES = 8  # Rademacher probes for the reported log_z and variance share with Lanczos variances
_MAX_CG = 5000  # CG steps for the mean with Lanczos variances (stops at a relative residual of 10⁻² √ε)


class AbstractLocalBound(eqx.Module):
    """An exponentiated-quadratic lower bound log φ(x) ≥ a x − ½ A x² + c with parameter ξ."""

    @abc.abstractmethod
    def quadratic(self, xi):
        """``(a, A, c)`` at ``xi``, each broadcastable to the group's sites."""

    @abc.abstractmethod
    def update(self, mean, var):
        """The ξ maximising ⟨a x − ½ A x² + c⟩ for x ~ N(mean, var) (shape ``(N,)`` each)."""

    def __call__(self, x, xi):
        """The bound itself at ``x`` (for checks: it is ≤ log φ(x))."""
        a, A, c = self.quadratic(xi)
        return a * x - 0.5 * A * x**2 + c

    def expected(self, mean, var):
        """max_ξ ⟨a x − ½ A x² + c⟩ ≤ ⟨log φ(x)⟩ for x ~ N(``mean``, ``var``), elementwise and differentiable."""
        a, A, c = self.quadratic(self.update(mean, var))
        return a * mean - 0.5 * A * (mean**2 + var) + c


class Jaakkola(AbstractLocalBound):
    """log σ(x) ≥ log σ(ξ) + (x − ξ)/2 − λ(ξ)(x² − ξ²), λ(ξ) = tanh(ξ/2)/(4ξ): tight at x = ±ξ (Jaakkola & Jordan)."""

    def quadratic(self, xi):
        # λ(ξ) = tanh(ξ/2)/(4ξ), even in ξ, by its series 1/8 − ξ²/96 near 0; log σ(ξ) − ξ/2 = −log(2 cosh(ξ/2)).
        small = jnp.abs(xi) < 1e-4
        safe = jnp.where(small, 1.0, xi)
        lam = jnp.where(small, 0.125 - xi**2 / 96.0, jnp.tanh(0.5 * safe) / (4.0 * safe))
        return 0.5 * jnp.ones_like(xi), 2.0 * lam, jax.nn.log_sigmoid(xi) - 0.5 * xi + lam * xi**2

    def update(self, mean, var):
        return jnp.sqrt(mean**2 + var)


class Bohning(AbstractLocalBound):
    """log σ(x) ≥ log σ(ψ) + σ(−ψ)(x − ψ) − (x − ψ)²/8: tight at x = ψ, curvature ¼ everywhere (Böhning)."""

    def quadratic(self, psi):
        slope = jax.nn.sigmoid(-psi)
        return slope + 0.25 * psi, jnp.full_like(psi, 0.25), jax.nn.log_sigmoid(psi) - slope * psi - 0.125 * psi**2

    def update(self, mean, var):
        return mean


class ScaleMixture(AbstractLocalBound):
    """The tangent in y = (x − loc)² of the convex log φ(loc + √y) (`Laplace`, `StudentT`, `Cauchy`):
    log φ(x) ≥ log φ(loc + ξ) − ½ A(ξ)((x − loc)² − ξ²), A(ξ) = −(log φ)'(loc + ξ)/ξ, tight at x = loc ± ξ
    (Palmer et al. 2006)."""

    potential: pot.AbstractPotential

    def quadratic(self, xi):
        centred = eqx.tree_at(lambda p: p.loc, self.potential, jnp.zeros_like(self.potential.loc))
        # The bound is valid for every ξ ≠ 0; keep ξ off 0, where A is 0/0 (or ∞ for Laplace).
        tiny = jnp.finfo(jnp.result_type(xi)).tiny ** 0.25
        xi = jnp.where(jnp.abs(xi) < tiny, tiny, xi)
        log_phi, slope = jax.jvp(lambda t: centred.log_phi(t), (xi,), (jnp.ones_like(xi),))
        A = -slope / xi
        loc = self.potential.loc
        return A * loc, A, log_phi + 0.5 * A * (xi**2 - loc**2)

    def update(self, mean, var):
        return jnp.sqrt((mean - self.potential.loc) ** 2 + var)


class Exact(AbstractLocalBound):
    """A Gaussian site N(loc | x, scale²), which is its own quadratic (no parameter: ξ is None)."""

    potential: pot.Gaussian

    def quadratic(self, xi):
        loc, prec = self.potential.loc, 1.0 / self.potential.scale**2
        return loc * prec, prec, -0.5 * (LOG_2PI + jnp.log(self.potential.scale**2) + loc**2 * prec)

    def update(self, mean, var):
        return None


@functools.singledispatch
def local_bound(potential, bound: str = "jaakkola") -> AbstractLocalBound:
    """The local bound LVB uses for ``potential`` (``bound`` chooses among those for `Logistic`).
    Register one for a new type with ``vj.lvb.local_bound.register(MyPotential)``."""
    raise ValueError(
        f"LVB: no local variational bound for the potential {type(potential).__name__}. LVB needs an "
        "exponentiated-quadratic lower bound on every site (super-Gaussian sites); supported: Logistic "
        "(bound='jaakkola' or 'bohning'), Laplace, StudentT, Cauchy and Gaussian. Use vj.GKL() for "
        "other potentials, or register a bound with vj.lvb.local_bound.register.")


@local_bound.register
def _(potential: pot.Logistic, bound: str = "jaakkola"):
    return Jaakkola() if bound == "jaakkola" else Bohning()


@local_bound.register(pot.Laplace)
@local_bound.register(pot.StudentT)
@local_bound.register(pot.Cauchy)
def _(potential, bound: str = "jaakkola"):
    return ScaleMixture(potential)


@local_bound.register
def _(potential: pot.Gaussian, bound: str = "jaakkola"):
    return Exact(potential)


class MaskedBound(AbstractLocalBound):
    """A `Masked` potential's bound: ``bound`` where the mask is on, else the zero quadratic with ξ held at 1."""

    bound: AbstractLocalBound
    mask: jax.Array

    def quadratic(self, xi):
        return tuple(jnp.where(self.mask, t, 0.0) for t in self.bound.quadratic(xi))

    def update(self, mean, var):
        xi = self.bound.update(mean, var)
        return None if xi is None else jnp.where(self.mask, xi, jnp.ones_like(xi))


@local_bound.register
def _(potential: pot.Masked, bound: str = "jaakkola"):
    return MaskedBound(local_bound(potential.potential, bound), potential.mask)


def _check_bound(bound):
    if bound not in BOUNDS:
        hint = ""
        if isinstance(bound, str) and bound.startswith("piecewise"):
            hint = (" Piecewise bounds are not exponentiated quadratics, so LVB cannot use them; replace the "
                    "logistic sites with vj.piecewise.bound_logistic_sites(model, kind, pieces) and fit with "
                    "vj.GKL(), which gives a lower bound on the logistic model's log Z.")
        raise ValueError(f"LVB: `bound` must be one of {BOUNDS}, got {bound!r}.{hint}")


def _site_bounds(model: LatentLinearModel, bound: str):
    _check_bound(bound)
    return tuple(local_bound(group.potential, bound) for group in model.sites)


def _quadratics(xi, model: LatentLinearModel, bound: str):
    return tuple(site.quadratic(x) for site, x in zip(_site_bounds(model, bound), xi))


def bound(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """B_LVB(ξ) ≤ log Z (pure, differentiable; ``bound``: the `Logistic` bound); NaN where P is not PD."""
    return integrate(model, _quadratics(xi, model, bound))[0]


def gaussian(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """The Gaussian q_ξ = N(P⁻¹r, P⁻¹) of the bound at ``xi``: ``(mean, CholeskyFactor)``."""
    _, mean, C = integrate(model, _quadratics(xi, model, bound))
    return mean, CholeskyFactor.from_matrix(C)


def _update(model, bound, mean, factor):
    """The optimal ξ for q = N(mean, S), S given by a covariance-family factor."""
    return _update_from_marginals(model, bound, tuple(g.project(mean) for g in model.sites),
                                  tuple(factor.projected_variances(g.projection) for g in model.sites))


def _update_from_marginals(model, bound, means, variances):
    """The optimal ξ given q's marginals of every site's x_n."""
    return tuple(site.update(m, v) for site, m, v in zip(_site_bounds(model, bound), means, variances))


def update(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """One fixed-point step: the optimal ξ given q_ξ (ξ_n² = ⟨x_n²⟩, ψ_n = ⟨x_n⟩, ...); never lowers the bound."""
    mean, factor = gaussian(xi, model, bound)
    return _update(model, bound, mean, factor)


class LVBState(eqx.Module):
    """The State of `LVB` (``post.state``): `xi`, the site parameters (as `bound`'s ``xi``; they define q_ξ), `mean`,
    q's mean ``(D,)`` (where CG starts with ``variances="lanczos"``), and `bound`, the `Logistic` bound."""

    xi: tuple
    mean: jax.Array
    bound: str = eqx.field(static=True, default="jaakkola")


class LVB(AbstractMethod):
    """Local variational bounds: maximise B_LVB(ξ) over the site parameters by SQUAREM-accelerated EM steps.

    Returns q = q_ξ* (a full `CholeskyFactor`, S = P⁻¹) and ``log_z`` = B_LVB(ξ*) ≤ log Z, differentiable by the
    envelope theorem; ``diagnostics.grad_norm`` is max |∂B/∂ξ| at the end. With ``variances="lanczos"`` P is never
    formed (large D, no dense Gaussian factor; thesis §5.4 after glm-ie): CG for the mean, k Lanczos vectors for the
    (understated, `vj.posterior.LVBInfo`) variances, ``log_z`` an estimate without gradient, q's covariance a rank-k
    `SubspaceFactor` (exact solves: `covariance_solve`), plain steps until ‖Δξ‖₂/‖ξ‖₂ ≤ ``tol``.

    **Arguments:**

    - `bound`: the `Logistic` bound, ``"jaakkola"`` (default; tighter) or ``"bohning"`` (curvature ¼).
    - `max_iter`: the most points evaluated (default 500; each O(N D² + D³)).
    - `tol`: the distance of ξ from the fixed point in q's marginal standard deviations at which the fit stops
      (default 1e-9; `vj.solvers.fixed_point`): ``log_z``'s gradient is good to about ``tol``, the bound to ``tol²``.
    - `variances`: ``"exact"`` (default; forms and factorises P) or ``"lanczos"``.
    - `num_lanczos`: k (default 80, as the thesis).
    - `num_probes`: probes behind ``log_z`` and ``variance_fraction`` (default 8; each after the first: k products).
    """

    bound: str = eqx.field(static=True, default="jaakkola")
    max_iter: int = eqx.field(static=True, default=500)
    tol: float = 1e-9
    variances: str = eqx.field(static=True, default="exact")
    num_lanczos: int = eqx.field(static=True, default=80)
    num_probes: int = eqx.field(static=True, default=_NUM_PROBES)

    def __check_init__(self):
        _check_bound(self.bound)
        if self.variances not in VARIANCES:
            raise ValueError(f"LVB: `variances` must be one of {VARIANCES}, got {self.variances!r}.")
        _checks.integer("num_lanczos", self.num_lanczos, "LVB")
        _checks.integer("num_probes", self.num_probes, "LVB")

    def _iterate(self, xi, model):
        """SQUAREM-accelerated fixed-point steps; each needs only q_ξ's marginals (`marginals`)."""
        work = working_model(model)

        def evaluate(xi):
            value, means, variances = marginals(model, _quadratics(xi, model, self.bound), work)
            return value, (means, variances)

        def update(xi, aux):
            return _update_from_marginals(model, self.bound, *aux)

        def change(a, b, aux):
            # max_n |Δξ_n| / √V_n, in units of q's marginal standard deviations (Gaussian groups have no ξ).
            return max((jnp.max(jnp.abs(u - w) / jnp.sqrt(v), initial=0.0)
                        for u, w, v in zip(a, b, aux[1]) if u is not None), default=jnp.zeros(()))

        return fixed_point(evaluate, update, change, xi, tol=self.tol, max_evals=self.max_iter,
                           floor=1e3 * float(jnp.finfo(model.dtype).eps))

    def _outer_loops(self, xi, model, v0, mean0):
        """glm-ie's outer loop: plain steps ξ ← F̂(ξ) (not monotone: no SQUAREM) until ‖F̂(ξ) − ξ‖₂/‖ξ‖₂ ≤ ``tol``."""
        def step(k, state):
            xi, _, _, trace, mean = state
            value, means, variances, extras = _lanczos_marginals(model, _quadratics(xi, model, self.bound),
                                                                 self.num_lanczos, v0, mean, inner)
            new = _update_from_marginals(model, self.bound, means, variances)
            pairs = [(u, w) for u, w in zip(new, xi) if u is not None]
            moved = sum((jnp.sum((u - w) ** 2) for u, w in pairs), jnp.zeros((), value.dtype))
            size = sum((jnp.sum(w**2) for _, w in pairs), jnp.zeros((), value.dtype))
            return new, value, jnp.sqrt(moved / jnp.where(size > 0, size, 1.0)), trace.at[k].set(value), extras[0]

        dtype = model.dtype
        inner = _inner_rtol(self.tol, dtype)
        state = (xi, jnp.array(jnp.nan, dtype), jnp.array(jnp.inf, dtype), nan_trace(self.max_iter, dtype), mean0)
        (xi, value, change, trace, mean), k = iterate(step, state, self.max_iter, done=lambda k, s: s[2] <= self.tol)
        return FixedPoint(xi, value, k, change <= self.tol, change, trace), mean

    def init_state(self, model) -> LVBState:
        frozen = jax.lax.stop_gradient(model)
        if self.variances == "exact":
            return self.from_expansion(frozen, expand_at_mode(frozen))
        # Not the Laplace start, which forms P: the Gaussian factor's (or the unit) moments.
        mean, scale = frozen.initial_moments()
        return LVBState(_update(frozen, self.bound, mean, DiagonalFactor(scale)), jnp.zeros_like(mean), self.bound)

    def from_expansion(self, model, expansion) -> LVBState:
        """ξ from the Laplace approximation's marginals (the Gaussian factor's moments where improper or Lanczos)."""
        frozen = jax.lax.stop_gradient(model)
        mean, scale = frozen.initial_moments()
        fallback = _update(frozen, self.bound, mean, DiagonalFactor(scale))
        if self.variances == "lanczos":
            return LVBState(fallback, expansion.mode, self.bound)
        _, means, variances = marginals(frozen, expansion.quadratics)
        xi = _update_from_marginals(frozen, self.bound, means, variances)
        xi = tuple(None if a is None else jnp.where(jnp.all(jnp.isfinite(a)), a, b) for a, b in zip(xi, fallback))
        return LVBState(xi, expansion.mode, self.bound)

    def from_gaussian(self, model, mean, factor) -> LVBState:
        return LVBState(_update(jax.lax.stop_gradient(model), self.bound, mean, factor), mean, self.bound)

    def is_state(self, model, state) -> bool:
        if not isinstance(state, LVBState) or state.bound != self.bound:
            return False
        expected = jax.eval_shape(lambda: _update(model, self.bound, jnp.zeros(model.dim, model.dtype),
                                                  DiagonalFactor(jnp.ones(model.dim, model.dtype))))
        return same_shapes(state.xi, expected)

    def solve(self, model: LatentLinearModel, state: LVBState) -> Posterior:
        if self.variances == "lanczos":
            return self._fit_lanczos(model, state)
        frozen = jax.lax.stop_gradient(model)
        xi = jax.lax.stop_gradient(state.xi)
        run = self._iterate(xi, frozen)
        xi, k, trace = run.x, run.evaluations, run.trace
        _, mean, C = integrate(frozen, _quadratics(xi, frozen, self.bound))
        grad = jax.grad(bound)(xi, frozen, self.bound)
        grad_norm = max((jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)),
                        default=jnp.zeros((), trace.dtype))
        log_z = bound(xi, model, self.bound)  # at the frozen ξ*, live model: the envelope theorem
        diagnostics = Diagnostics(iterations=k, status=Status.of(run.converged, value=run.value),
                                  stationarity=run.distance, grad_norm=grad_norm,
                                  objective_trace=trace, num_value_evals=k, num_grad_evals=1, num_hvp_evals=0,
                                  method="LVB", solver="fixed_point")
        return Posterior(mean, CholeskyFactor.from_matrix(C).canonical(), log_z, diagnostics, model,
                         bound_claim=True, state=LVBState(xi, mean, self.bound))

    def check_model(self, model) -> None:
        super().check_model(model)
        if self.variances == "lanczos" and model.prior is not None and model.prior.whitening() is not None:
            raise ValueError("LVB: variances='lanczos' needs a model without a dense Gaussian factor (GP prior), "
                             "whose whitening would form a D × D matrix anyway; use variances='exact'.")

    def _fit_lanczos(self, model, state):
        """The double loop of glm-ie (Seeger & Nickisch 2011), matrix-free: see `_lanczos_marginals`."""
        self.check_model(model)
        frozen = jax.lax.stop_gradient(model)
        xi, mean0 = jax.lax.stop_gradient((state.xi, state.mean))  # the state's mean starts the first CG solve
        probes = jax.random.rademacher(jax.random.PRNGKey(0), (max(self.num_probes, _NUM_PROBES), frozen.dim),
                                       frozen.dtype)[:self.num_probes]  # num_probes ≤ 8: the first of the same 8
        run, last_mean = self._outer_loops(xi, frozen, probes[0], mean0)
        quadratics = _quadratics(run.x, frozen, self.bound)
        _, _, _, (mean, theta, V, cg, first) = _lanczos_marginals(frozen, quadratics, self.num_lanczos,
                                                                  probes[0], last_mean)
        # The reported value and captured share from all probes; the first probe's is that last Lanczos run's.
        product, r, const = precision_operator(frozen, quadratics)
        k = min(self.num_lanczos, frozen.dim)
        logdet, trace = first
        if self.num_probes > 1:
            rest = jnp.sum(jax.vmap(lambda v: _quadrature(product, v, k))(probes[1:]), axis=0)
            logdet, trace = (first + rest) / self.num_probes
        value = const + 0.5 * r @ mean + 0.5 * frozen.dim * LOG_2PI - 0.5 * logdet
        fraction = jnp.sum(1 / theta) / trace
        # S ≈ V Θ⁻¹ Vᵀ plus, outside the Krylov space, the smallest variance found, 1/θ_max, so that q is proper.
        factor = SubspaceFactor(V, jnp.diag(1 / jnp.sqrt(theta)), 1 / jnp.sqrt(theta[-1]))
        info = LVBInfo(jnp.asarray(k), fraction, cg)
        diagnostics = Diagnostics(iterations=run.evaluations, status=Status.of(run.converged, value=run.value),
                                  stationarity=run.distance,
                                  objective_trace=run.trace, num_value_evals=run.evaluations, num_grad_evals=0,
                                  num_hvp_evals=0, method="LVB", solver="fixed_point", info=info)
        return Posterior(mean, factor, jax.lax.stop_gradient(value), diagnostics, model, bound_claim=False,
                         state=LVBState(run.x, mean, self.bound))


def _inner_rtol(tol, dtype):
    """CG's relative residual in the outer loop: 10⁻⁴ · tol, within [10⁻² √ε (the final solve's), 10⁻⁶]."""
    tight = 1e-2 * float(jnp.finfo(dtype).eps) ** 0.5
    return jnp.maximum(tight, jnp.minimum(1e-6, 1e-4 * jnp.asarray(tol, dtype)))


def _jacobi(model, quadratics, dtype):
    """v ↦ D⁻¹ v, D = Σ_n A_n h_n² (the sites' part of diag P, which absorbs A_n's spread in magnitude)."""
    diagonal = sum((group.projection.squared_rmv(jnp.broadcast_to(A, (group.num_sites,)).astype(dtype))
                    for group, (_, A, _) in zip(model.sites, quadratics)), jnp.zeros(model.dim, dtype))
    # Coordinates the sites do not reach keep a unit scale.
    inverse = jnp.where(diagonal > 0, 1.0 / jnp.where(diagonal > 0, diagonal, 1.0), 1.0)
    return lambda v: inverse * v


def covariance_solve(post: Posterior, rtol: float = 1e-6):
    """V ↦ S V (V ``(D,)`` or ``(D, K)``) for an LVB posterior's exact covariance S = P⁻¹, by Jacobi-preconditioned
    CG on P = Λ + Σ_n A_n(ξ) h_n h_nᵀ (never formed) to ‖v − P x‖ ≤ ``rtol`` ‖v‖ (`vj.design.free_design`)."""
    state = post.state
    if not isinstance(state, LVBState):
        raise ValueError("lvb.covariance_solve: `post` must be a vj.LVB fit (its `state` an LVBState), got a "
                         f"posterior with state {type(state).__name__}.")
    model = jax.lax.stop_gradient(post.model)
    quadratics = _quadratics(state.xi, model, state.bound)
    product, _, _ = precision_operator(model, quadratics)
    preconditioner = _jacobi(model, quadratics, model.dtype)

    def solve(v):
        return pcg(product, v, preconditioner, _MAX_CG, rtol)[0]

    return lambda V: solve(V) if V.ndim == 1 else jax.vmap(solve, in_axes=1, out_axes=1)(V)


def _quadrature(product, v, k):
    """vᵀ log(P) v and vᵀ P⁻¹ v by k-point Lanczos quadrature: for a Rademacher v, estimates of log det P, tr P⁻¹."""
    theta, _, weights = ritz_pairs(product, v, k)
    return _quadrature_sums(theta, weights, v)


def _quadrature_sums(theta, weights, v):
    """`_quadrature` from the Ritz values and weights of a Lanczos run started at ``v``."""
    scale = jnp.vdot(v, v)
    return jnp.stack([scale * jnp.sum(weights * jnp.log(theta)), scale * jnp.sum(weights / theta)])


def _lanczos_marginals(model, quadratics, num_lanczos, v0, mean0=None, rtol=None):
    """``(value, means, variances, extras)`` with P never formed: m = P⁻¹ r by Jacobi-preconditioned CG from ``mean0``
    to ‖r − P m‖ ≤ rtol ‖r‖ (default 10⁻² √ε), V̂_n = Σ_k (h_nᵀ u_k)²/θ_k ≤ h_nᵀ P⁻¹ h_n by Lanczos from ``v0``;
    extras = (m, θ ascending, the Ritz vectors, CG steps, v0's `_quadrature`)."""
    product, r, const = precision_operator(model, quadratics)
    dtype, d = model.dtype, model.dim
    rtol = 1e-2 * float(jnp.finfo(dtype).eps) ** 0.5 if rtol is None else rtol
    preconditioner = _jacobi(model, quadratics, r.dtype)
    if mean0 is None:
        mean, cg_steps = pcg(product, r, preconditioner, _MAX_CG, rtol)
    else:
        residual = r - product(mean0)  # solve P δ = r − P m₀ to the same absolute residual rtol ‖r‖
        size = jnp.linalg.norm(residual)
        scaled = rtol * jnp.linalg.norm(r) / jnp.where(size > 0, size, 1.0)
        delta, cg_steps = pcg(product, residual, preconditioner, _MAX_CG, scaled)
        mean, cg_steps = mean0 + delta, cg_steps + 1
    theta, V, weights = ritz_pairs(product, v0, min(int(num_lanczos), d))
    quadrature = _quadrature_sums(theta, weights, v0)  # (log det P, tr P⁻¹) estimates
    value = const + 0.5 * r @ mean + 0.5 * d * LOG_2PI - 0.5 * quadrature[0]
    value = jnp.where(jnp.all(theta > 0), value, jnp.nan)
    means = tuple(g.project(mean) for g in model.sites)
    variances = tuple(jnp.sum(g.projection.mv(V) ** 2 / theta, axis=1) for g in model.sites)
    return value, means, variances, (mean, theta, V, cg_steps, quadrature)
