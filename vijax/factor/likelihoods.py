"""Per-column likelihoods p(y_d | η_d) of a latent Gaussian factor model, with their Gaussian bounds.

Column d has K predictors η_d = W_d z + w_0d (K = 1 but for categorical data); under q(z) = N(m, V),
η_d ~ N(m̃_d, Ṽ_d) and each likelihood gives a bound f̲(y, m̃, Ṽ) ≤ ⟨log p(y | η)⟩ (Khan thesis eq. 3.20) with
its local variational parameters at their optimum, so (envelope theorem) its gradients in (m̃, Ṽ) are those at
fixed local parameters. Methods act on a block's D_b columns at once: ``y`` ``(D_b,)``, ``mean`` ``(D_b, K)``,
``cov`` ``(D_b, K, K)``; per-column parameters have a leading axis D_b (`for_columns` broadcasts scalars).

Binary, ordinal and stick-breaking columns bound the logistic log-partition llp(x) = log(1 + eˣ) by ``bound``:
``"piecewise"`` (default: `vijax.potentials.PiecewiseLogistic`, ``pieces`` 3 … 20, ``kind`` ``"quadratic"`` or
``"linear"``), ``"jaakkola"`` (`vijax.lvb.Jaakkola` at ξ = √(m̃² + ṽ), eq. 4.43) or ``"bohning"``
(`vijax.lvb.Bohning` at ψ = m̃, eq. 4.41: curvature ¼, so every point has the same posterior covariance).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from .. import _checks, _piecewise
from .._linalg import backtrack
from .. import potentials as pot
from ..methods import lvb
from ..quadrature import safe_sqrt

__all__ = ["AbstractLikelihood", "GaussianColumn", "Bernoulli", "PoissonColumn", "Ordinal", "StickBreaking",
           "Multinomial", "LOGISTIC_BOUNDS", "MULTINOMIAL_BOUNDS"]

LOGISTIC_BOUNDS = ("piecewise", "jaakkola", "bohning")
MULTINOMIAL_BOUNDS = ("bohning", "log", "tilted", "pos")
_TILTED_ITERATIONS = 30
_HALVINGS = 20  # Newton steps on threshold parameters shortened at most 2⁻²⁰


class AbstractLikelihood(eqx.Module):
    """A column likelihood p(y | η), η ∈ R^K, and its bound f̲ on ⟨log p(y | η)⟩ under N(m̃, Ṽ).

    ``constant_curvature``: −2 ∂f̲/∂Ṽ is independent of y and q (all points share one covariance);
    ``intercept``: the column has an offset w_0d; ``num_outcomes``: discrete values (None if continuous)."""

    constant_curvature: ClassVar[bool] = False
    intercept: ClassVar[bool] = True

    @property
    def num_predictors(self) -> int:
        return 1

    @property
    def num_outcomes(self) -> int | None:
        return None

    @abc.abstractmethod
    def expected(self, y, mean, cov):
        """The bound f̲(y, m̃, Ṽ), shape ``(D_b,)``."""

    @abc.abstractmethod
    def log_prob(self, y, eta):
        """The exact log p(y | η) for ``eta`` of shape ``(D_b, K)``."""

    def curvature(self, num_columns: int, dtype):
        """−2 ∂f̲/∂Ṽ, shape ``(D_b, K, K)``, for likelihoods with ``constant_curvature``."""
        raise NotImplementedError(f"{type(self).__name__} has no constant curvature (`constant_curvature` is False).")

    def check(self, y: np.ndarray, owner: str) -> None:
        """Raise `ValueError` if observed values ``y`` (NumPy, shape ``(N, D_b)``) are out of range."""
        n = self.num_outcomes
        if n is None and not np.all(np.isfinite(y)):
            raise ValueError(f"{owner}: observed entries must be finite; mark missing ones with `mask`.")
        if n is not None and not np.all((y == np.round(y)) & (y >= 0) & (y <= n - 1)):
            values = "0 or 1" if n == 2 else f"0 … {n - 1}"
            raise ValueError(f"{owner}: {type(self).__name__}({n}) columns take the integer classes {values}.")

    def for_columns(self, num_columns: int) -> "AbstractLikelihood":
        """This likelihood with its per-column parameters broadcast to ``num_columns`` columns."""
        return self

    def update(self, y, weight, mean, cov) -> "AbstractLikelihood":
        """M-step for the likelihood's own parameters given q's predictors (``(N, D_b, ...)``); ``weight``
        ``(N, D_b)``: the row's weight where observed, 0 where missing (``y`` a valid placeholder there)."""
        return self

    def predictive_mean(self, mean, cov):
        """⟨E[y | η]⟩ under N(m̃, Ṽ), shape ``(D_b,)`` (continuous data)."""
        raise NotImplementedError(f"{type(self).__name__} models discrete data: it has no predictive mean.")


class _LogPartitionBound(eqx.Module):
    """An upper bound on ⟨llp(x)⟩, x ~ N(m, v): minus a lower bound on ⟨log σ(−x)⟩ (module docstring)."""

    bound: str = eqx.field(static=True)
    pieces: int = eqx.field(static=True, converter=int)
    kind: str = eqx.field(static=True)

    def __check_init__(self):
        if self.bound not in LOGISTIC_BOUNDS:
            raise ValueError(f"`bound` must be one of {LOGISTIC_BOUNDS}, got {self.bound!r}.")
        if self.bound == "piecewise":
            _piecewise.check(self.kind, self.pieces, "bound='piecewise'")

    def __call__(self, m, v):
        if self.bound == "piecewise":
            return -pot.PiecewiseLogistic(self.pieces, self.kind).expected_log_phi(-m, jnp.sqrt(v))
        return -lvb.local_bound(pot.Logistic(), self.bound).expected(-m, v)


class GaussianColumn(AbstractLikelihood):
    """y ~ N(η, ψ), per-column noise variance ψ (``noise``), learned in closed form by the M-step,
    ψ_d = mean over observed n of (y − m̃)² + ṽ, unless ``learn_noise=False``. Exact bound (the
    `vijax.potentials.Gaussian` site's): ⟨log N(y | η, ψ)⟩ = log N(y | m̃, ψ) − ṽ/(2ψ)."""

    noise: jax.Array
    learn_noise: bool = eqx.field(static=True, default=True)
    constant_curvature: ClassVar[bool] = True

    def __init__(self, noise=1.0, learn_noise: bool = True):
        noise = _checks.as_param("noise", noise, type(self).__name__)
        _checks.check_positive("noise", noise, type(self).__name__)
        self.noise, self.learn_noise = noise, bool(learn_noise)

    def for_columns(self, num_columns):
        return type(self)(jnp.broadcast_to(self.noise, (num_columns,)), self.learn_noise)

    def _site(self, y):
        return pot.Gaussian(loc=y, scale=jnp.sqrt(self.noise))

    def expected(self, y, mean, cov):
        return self._site(y).expected_log_phi(mean[:, 0], safe_sqrt(cov[:, 0, 0]))

    def log_prob(self, y, eta):
        return self._site(y).log_phi(eta[:, 0])

    def curvature(self, num_columns, dtype):
        return jnp.broadcast_to(1.0 / self.noise, (num_columns,)).astype(dtype)[:, None, None]

    def update(self, y, weight, mean, cov):
        if not self.learn_noise:
            return self
        total = jnp.sum(weight, 0)
        resid = jnp.sum(weight * ((y - mean[..., 0]) ** 2 + cov[..., 0, 0]), 0)
        noise = resid / jnp.where(total > 0, total, 1.0)
        floor = 1e-6 * jnp.maximum(jnp.max(noise), jnp.finfo(noise.dtype).tiny)
        noise = jnp.where(total > 0, jnp.maximum(noise, floor), self.noise)
        return eqx.tree_at(lambda g: g.noise, self, noise)

    def predictive_mean(self, mean, cov):
        return mean[:, 0]


class Bernoulli(AbstractLikelihood):
    """Bernoulli-logit, p(y = 1 | η) = σ(η), y ∈ {0, 1}: f̲ = y m̃ − ⟨llp(η)⟩, the llp bound for both labels
    (the piecewise bound is not symmetric: f̄(x) − x ≠ f̄(−x))."""

    llp: _LogPartitionBound

    def __init__(self, bound: str = "piecewise", pieces: int = 20, kind: str = "quadratic"):
        self.llp = _LogPartitionBound(bound, pieces, kind)

    @property
    def constant_curvature(self):  # type: ignore[override]
        return self.llp.bound == "bohning"

    @property
    def num_outcomes(self):
        return 2

    def expected(self, y, mean, cov):
        return y * mean[:, 0] - self.llp(mean[:, 0], cov[:, 0, 0])

    def log_prob(self, y, eta):
        return y * eta[:, 0] - jax.nn.softplus(eta[:, 0])

    def curvature(self, num_columns, dtype):
        return jnp.full((num_columns, 1, 1), 0.25, dtype)  # Böhning's (`lvb.Bohning`): A = ¼


class PoissonColumn(AbstractLikelihood):
    """Poisson counts with log link, p(y | η) = e^{yη − e^η}/y!: f̲ = y m̃ − e^{m̃ + ṽ/2} − log y! (exact),
    the `vijax.potentials.Poisson` site's expectation."""

    def expected(self, y, mean, cov):
        return pot.Poisson(y).expected_log_phi(mean[:, 0], safe_sqrt(cov[:, 0, 0]))

    def log_prob(self, y, eta):
        return pot.Poisson(y).log_phi(eta[:, 0])

    def check(self, y, owner):
        if not np.all((y >= 0) & (y == np.round(y))):
            raise ValueError(f"{owner}: Poisson columns take non-negative integer counts.")

    def predictive_mean(self, mean, cov):
        return jnp.exp(mean[:, 0] + 0.5 * cov[:, 0, 0])


class Ordinal(AbstractLikelihood):
    """Cumulative logit (proportional odds), y ∈ {0, …, C−1}: P(y ≤ k | η) = σ(φ_{k+1} − η).

        log p(y = k | η) = η − llp(η − φ_{k+1}) − llp(η − φ_k) + log(e^{−φ_k} − e^{−φ_{k+1}}),   0 < k < C−1

    (thesis eq. 6.4, sign corrected), log p(y = 0 | η) = −llp(η − φ_1), log p(y = C−1 | η) = η − φ_{C−1} −
    llp(η − φ_{C−1}). φ_1 = ``first``, φ_{k+1} = φ_k + exp(``log_gaps``_k) keeps them ordered; the M-step
    learns them per column by Newton's method. No intercept (the thresholds absorb it)."""

    first: jax.Array
    log_gaps: jax.Array
    llp: _LogPartitionBound
    num_levels: int = eqx.field(static=True)
    intercept: ClassVar[bool] = False

    def __init__(self, num_levels: int, bound: str = "piecewise", pieces: int = 20, kind: str = "quadratic",
                 thresholds=None):
        num_levels = _checks.integer("num_levels", num_levels, "Ordinal", minimum=2)
        self.num_levels, self.llp = num_levels, _LogPartitionBound(bound, pieces, kind)
        if thresholds is None:  # logistic quantiles of equally likely levels
            p = np.arange(1, num_levels) / num_levels
            thresholds = np.log(p / (1 - p))
        t = _checks.as_param("thresholds", thresholds, "Ordinal")
        if t.shape[-1] != num_levels - 1 or (_checks.is_concrete(t) and not bool(jnp.all(jnp.diff(t) > 0))):
            raise ValueError(f"Ordinal: `thresholds` must be {num_levels - 1} increasing values.")
        self.first, self.log_gaps = t[..., 0], jnp.log(jnp.diff(t, axis=-1))

    @property
    def num_outcomes(self):
        return self.num_levels

    @property
    def thresholds(self):
        """φ_1 … φ_{C−1}, shape ``(..., C−1)``."""
        steps = jnp.concatenate([self.first[..., None], jnp.exp(self.log_gaps)], -1)
        return jnp.cumsum(steps, -1)

    def for_columns(self, num_columns):
        t = jnp.broadcast_to(self.thresholds, (num_columns, self.num_levels - 1))
        return Ordinal(self.num_levels, self.llp.bound, self.llp.pieces, self.llp.kind, t)

    def _terms(self, y, eta, llp):
        """(linear part, the two llp arguments' thresholds, constant) of log p(y = k | η)."""
        k = y.astype(jnp.int32)
        c = self.num_levels
        phi = jnp.broadcast_to(self.thresholds, k.shape + (c - 1,))
        upper = jnp.take_along_axis(phi, jnp.clip(k, 0, c - 2)[:, None], 1)[:, 0]
        lower = jnp.take_along_axis(phi, jnp.clip(k - 1, 0, c - 2)[:, None], 1)[:, 0]
        has_upper, has_lower = k < c - 1, k > 0
        gap = jnp.where(has_upper & has_lower, upper - lower, 1.0)
        const = jnp.where(has_upper & has_lower, -lower + jnp.log(-jnp.expm1(-gap)), jnp.where(has_lower, -lower, 0.0))
        linear = jnp.where(has_lower, eta, 0.0)
        return (linear + const - jnp.where(has_upper, llp(eta - upper), 0.0)
                - jnp.where(has_lower, llp(eta - lower), 0.0))

    def expected(self, y, mean, cov):
        v = cov[:, 0, 0]
        return self._terms(y, mean[:, 0], lambda x: self.llp(x, v))

    def log_prob(self, y, eta):
        return self._terms(y, eta[:, 0], jax.nn.softplus)

    def update(self, y, weight, mean, cov, steps: int = 5):
        def column(first, log_gaps, yd, wd, meand, vard):
            # Newton on one column's C − 1 threshold parameters, backtracked so the bound never falls.
            def fn(x):
                lik = eqx.tree_at(lambda o: (o.first, o.log_gaps), self, (x[0], x[1:]))
                return jnp.sum(wd * lik.expected(yd, meand[:, None], vard[:, None, None]))

            def step(_, x):
                f0, g, h = fn(x), jax.grad(fn)(x), jax.hessian(fn)(x)
                w, q = jnp.linalg.eigh(0.5 * (h + h.T))
                w = jnp.minimum(w, -1e-8 * (1.0 + jnp.max(jnp.abs(w))))  # ascent direction even if not concave
                direction = -(q / w) @ (q.T @ g)
                t, _, ok, _ = backtrack(lambda t: fn(x + t * direction), lambda t, f: f >= f0,
                                        jnp.ones((), x.dtype), _HALVINGS)
                return jnp.where(ok, x + t * direction, x)

            x = jax.lax.fori_loop(0, steps, step, jnp.concatenate([first[None], log_gaps]))
            return x[0], x[1:]

        first, log_gaps = jax.vmap(column, in_axes=(0, 0, 1, 1, 1, 1))(
            self.first, self.log_gaps, y, weight, mean[..., 0], cov[..., 0, 0])
        return eqx.tree_at(lambda o: (o.first, o.log_gaps), self, (first, log_gaps))


class _Categorical(AbstractLikelihood):
    """Shared by the categorical likelihoods: y ∈ {0, …, C−1} with K = C − 1 predictors."""

    num_classes: int = eqx.field(static=True)

    def _set_classes(self, num_classes):
        self.num_classes = _checks.integer("num_classes", num_classes, type(self).__name__, minimum=2)

    @property
    def num_predictors(self):
        return self.num_classes - 1

    @property
    def num_outcomes(self):
        return self.num_classes


class StickBreaking(_Categorical):
    """Stick-breaking categorical likelihood (Khan et al. 2012), y ∈ {0, …, C−1}, K = C − 1 sticks:

        log p(y = k | η) = [k < C−1] η_k − Σ_{j ≤ min(k, C−2)} llp(η_j)   (thesis eq. 5.35),

    each ⟨llp⟩ bounded by ``bound``; the categories in label order. The curvature depends on y even with
    Böhning (the sticks after y's do not enter), so no covariance is shared between points."""

    llp: _LogPartitionBound

    def __init__(self, num_classes: int, bound: str = "piecewise", pieces: int = 20, kind: str = "quadratic"):
        self._set_classes(num_classes)
        self.llp = _LogPartitionBound(bound, pieces, kind)

    def _weights(self, y):
        j = jnp.arange(self.num_classes - 1)
        k = y.astype(jnp.int32)[:, None]
        return (j == k).astype(float), (j <= k).astype(float)

    def expected(self, y, mean, cov):
        a, b = self._weights(y)
        return jnp.sum(a * mean - b * self.llp(mean, jnp.diagonal(cov, axis1=-2, axis2=-1)), -1)

    def log_prob(self, y, eta):
        a, b = self._weights(y)
        return jnp.sum(a * eta - b * jax.nn.softplus(eta), -1)


class Multinomial(_Categorical):
    """Multinomial logit, y ∈ {0, …, C−1}, p(y = k | η) = e^{η_k}/Σ_j e^{η_j}, η_0 = 0, K = C − 1 predictors.

    ⟨lse⟩ is bounded by ``bound``:

    - ``"bohning"`` (default; thesis §5.4): f̲ = eᵀm̃ − lse₁(m̃) − ½ tr(AṼ), A = ½(I − 11ᵀ/C) fixed, so all
      points share one covariance;
    - ``"log"`` (Blei & Lafferty): f̲ = eᵀm̃ − lse₁(m̃ + ṽ/2);
    - ``"tilted"``: ⟨lse(η)⟩ ≤ aᵀm̃ + log Σ_k exp(β_kᵀm̃ + ½β_kᵀṼβ_k), β_k = e_k − a, the full-covariance
      tilted bound (thesis A.59; Knowles & Minka's diagonal form is not valid), a at its fixed point; ≥ "log";
    - ``"pos"`` (product of sigmoids, Bouchard 2007): lse(η) ≤ β + Σ_k llp(η_k − β), each ⟨llp⟩ by the
      ``pieces``-piece ``kind`` bound, β by Newton's method; accurate only near one predictor's direction.
    """

    bound: str = eqx.field(static=True)
    llp: _LogPartitionBound

    def __init__(self, num_classes: int, bound: str = "bohning", pieces: int = 20, kind: str = "quadratic"):
        self._set_classes(num_classes)
        if bound not in MULTINOMIAL_BOUNDS:
            raise ValueError(f"Multinomial: `bound` must be one of {MULTINOMIAL_BOUNDS}, got {bound!r}.")
        self.bound = bound
        self.llp = _LogPartitionBound("piecewise", pieces, kind)

    @property
    def constant_curvature(self):  # type: ignore[override]
        return self.bound == "bohning"

    def _onehot(self, y):
        return jax.nn.one_hot(y.astype(jnp.int32) - 1, self.num_classes - 1)  # class 0 → all zeros

    def _bohning_matrix(self, dtype):
        k = self.num_classes - 1
        return 0.5 * (jnp.eye(k, dtype=dtype) - jnp.ones((k, k), dtype) / self.num_classes)

    def expected(self, y, mean, cov):
        linear = jnp.sum(self._onehot(y) * mean, -1)
        if self.bound == "bohning":
            return linear - _lse1(mean) - 0.5 * jnp.einsum("kj,dkj->d", self._bohning_matrix(mean.dtype), cov)
        if self.bound == "log":
            return linear - _lse1(mean + 0.5 * jnp.diagonal(cov, axis1=-2, axis2=-1))
        if self.bound == "pos":
            return linear - jax.vmap(lambda m, v: _pos_lse(m, v, self.llp))(mean, jnp.diagonal(cov, axis1=-2, axis2=-1))
        return linear - jax.vmap(_tilted_lse)(mean, cov)

    def log_prob(self, y, eta):
        return jnp.sum(self._onehot(y) * eta, -1) - _lse1(eta)

    def curvature(self, num_columns, dtype):
        return jnp.broadcast_to(self._bohning_matrix(dtype), (num_columns,) + (self.num_classes - 1,) * 2)


def _lse1(x):
    """log(1 + Σ_k e^{x_k}) over the last axis."""
    return logsumexp(jnp.concatenate([jnp.zeros_like(x[..., :1]), x], -1), axis=-1)


def _tilted_lse(mean, cov):
    """The full-covariance tilted bound on ⟨lse(0, η)⟩ for η ~ N(mean, cov), one column."""
    m = jnp.concatenate([jnp.zeros_like(mean[:1]), mean])
    v = jnp.pad(cov, ((1, 0), (1, 0)))

    def exponents(a):  # β_kᵀm + ½β_kᵀVβ_k, β_k = e_k − a
        beta = jnp.eye(m.shape[0], dtype=m.dtype) - a
        return beta @ m + 0.5 * jnp.einsum("ki,ij,kj->k", beta, v, beta)

    bound = lambda a: a @ m + logsumexp(exponents(a))
    a, _ = jax.lax.scan(lambda a, _: (jax.nn.softmax(exponents(a)), None), jax.nn.softmax(m), None,
                        length=_TILTED_ITERATIONS)
    # Every a gives a valid bound; take the better of the fixed point and the log bound (a = 0).
    a = jax.lax.stop_gradient(jnp.where(bound(a) <= bound(jnp.zeros_like(a)), a, jnp.zeros_like(a)))
    return bound(a)


def _pos_lse(mean, var, llp):
    """The product-of-sigmoids bound β + llp(−β) + Σ_k ⟨llp(η_k − β)⟩ on ⟨lse(0, η)⟩, one column."""

    def bound(beta):
        return beta + jax.nn.softplus(-beta) + jnp.sum(llp(mean - beta, var))

    slope, curvature = jax.grad(bound), jax.grad(jax.grad(bound))

    def newton(beta, _):  # the bound is convex in β up to the piecewise bound's jumps: floor the curvature
        return beta - slope(beta) / jnp.maximum(curvature(beta), 1e-6), None

    start = _lse1(mean)
    beta, _ = jax.lax.scan(newton, start, None, length=_TILTED_ITERATIONS)
    # Every β gives a valid bound; keep the better of the Newton iterate and the start.
    beta = jax.lax.stop_gradient(jnp.where(bound(beta) <= bound(start), beta, start))
    return bound(beta)
