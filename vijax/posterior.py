"""What every method returns: a Gaussian posterior approximation and an evidence estimate."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import is_concrete
from ._linalg import batched_map
from .covariance import AbstractFactor
from .model import LatentLinearModel
from .projections import as_projection
from .solvers import Status

__all__ = ["Posterior", "Diagnostics", "Status", "EPInfo", "LaplaceInfo", "LVBInfo", "Mixture"]
__dir__ = __all__.copy


def _show(x) -> str:
    """A field for `repr`: a scalar as its value, an array as dtype and shape, a module by its own repr."""
    if x is None or isinstance(x, (bool, int, float, str, _Info, Diagnostics)):
        return repr(x)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if np.ndim(x) == 0:
            value = np.asarray(x).item()
            return f"{value:.6g}" if isinstance(value, float) else repr(value)
        return f"{np.dtype(x.dtype).name}{list(np.shape(x))}"
    return type(x).__name__


def _fields_repr(obj, names, **shown) -> str:
    """``Type(name=value, …)``; ``shown`` replaces a field's text."""
    return f"{type(obj).__name__}(" + ", ".join(f"{n}={shown.get(n) or _show(getattr(obj, n))}" for n in names) + ")"


class _Info(eqx.Module):
    """A method's record for `Diagnostics.info`, shown with its fields' values."""

    def __repr__(self):
        if not is_concrete(self):
            return super().__repr__()
        return _fields_repr(self, [field.name for field in dataclasses.fields(self)])


class EPInfo(_Info):
    """What expectation propagation reports beyond `Diagnostics` (``post.diagnostics.info``); all scalars.

    - `max_change`: the last iteration's largest site change, max over sites of |Δτ_n|·V_n and |Δν_n|·√V_n.
    - `skipped`: site updates left out (improper cavity or non-finite tilted moments); int.
    - `shrunk`: steps shortened to keep q and every cavity proper; int.
    - `fallback`: a schedule stopped improving and a more robust one took over (parallel → sequential → double
      loop); bool."""

    max_change: jax.Array
    skipped: jax.Array
    shrunk: jax.Array
    fallback: jax.Array


class LaplaceInfo(_Info):
    """What `vj.Laplace` and `vj.MAP` report beyond `Diagnostics` (``post.diagnostics.info``); scalars.

    - `fallback`: the Hessian at the mode was not negative definite, so the Gauss–Newton curvature stood in; bool.
    - `jitter`: added to the curvature's diagonal before factorising (0 unless it was singular); float."""

    fallback: jax.Array
    jitter: jax.Array


class LVBInfo(_Info):
    """What `vj.LVB` with ``variances="lanczos"`` reports (``post.diagnostics.info``).

    - `num_lanczos`: the Lanczos vectors k behind the variance estimates; int.
    - `variance_fraction`: Σ_n V̂_n / tr(P⁻¹), the share of q's total variance the lower-bound estimates hold.
    - `cg_iterations`: CG steps of the last solve P m = r for the mean; int."""

    num_lanczos: jax.Array
    variance_fraction: jax.Array
    cg_iterations: jax.Array


class Diagnostics(eqx.Module):
    """How a fit went: the fields every method reports (keyword-only), and a method's own record in `info`.

    Every field is a scalar (batched under `vmap`) except `objective_trace`, shape ``(max_iter + 1,)``, the
    objective after each iteration, NaN-padded. `iterations`: done; `status`: why the fit stopped, a `vj.Status`;
    `stationarity`: what convergence was judged by (the squared Newton decrement for solver-based fits, the
    moment-matching residual for EP, …; NaN: unmeasured); `grad_norm`: max |gradient| at the end (NaN: unmeasured);
    `num_value_evals`, `num_grad_evals`, `num_hvp_evals`: work done; `method`, `solver`: static names; `info`: None
    or the method's record (`EPInfo`, `LVBInfo`, `LaplaceInfo`, `vj.nn.NetworkInfo`)."""

    iterations: jax.Array = eqx.field(kw_only=True)
    status: jax.Array = eqx.field(kw_only=True, converter=lambda status: jnp.asarray(status, jnp.int32))
    stationarity: jax.Array = eqx.field(kw_only=True, default=None)
    grad_norm: jax.Array = eqx.field(kw_only=True, default=None)
    objective_trace: jax.Array = eqx.field(kw_only=True)
    num_value_evals: jax.Array = eqx.field(kw_only=True, default=0, converter=jnp.asarray)
    num_grad_evals: jax.Array = eqx.field(kw_only=True, default=0, converter=jnp.asarray)
    num_hvp_evals: jax.Array = eqx.field(kw_only=True, default=0, converter=jnp.asarray)
    method: str = eqx.field(static=True, kw_only=True)
    solver: str = eqx.field(static=True, kw_only=True)
    info: EPInfo | LaplaceInfo | LVBInfo | None = eqx.field(kw_only=True, default=None)

    def __post_init__(self):
        dtype = jnp.result_type(self.objective_trace)
        nan = jnp.full((), jnp.nan, dtype if jnp.issubdtype(dtype, jnp.floating) else float)
        self.stationarity = nan if self.stationarity is None else self.stationarity
        self.grad_norm = nan if self.grad_norm is None else self.grad_norm

    @property
    def converged(self) -> jax.Array:
        """Whether the method's stopping test held: ``status == vj.Status.CONVERGED`` (a bool array)."""
        return self.status == Status.CONVERGED

    @property
    def reason(self) -> str:
        """The status as a word (``"converged"``, ``"max_iter"``, …) for a concrete, unbatched fit."""
        return Status(int(self.status)).name.lower()

    @classmethod
    def from_solution(cls, sol, method: str, solver: str, info=None) -> "Diagnostics":
        """From a `vj.solvers` solution (its iterations, status, decrement, trace and counts)."""
        return cls(iterations=sol.iterations, status=sol.status, stationarity=sol.decrement,
                   grad_norm=sol.grad_norm, objective_trace=sol.trace, num_value_evals=sol.num_value_evals,
                   num_grad_evals=sol.num_grad_evals, num_hvp_evals=sol.num_hvp_evals, method=method,
                   solver=solver, info=info)

    def __repr__(self):
        if not is_concrete(self):
            return super().__repr__()
        fields = ("method", "solver", "iterations", "status", "stationarity", "grad_norm", "num_value_evals",
                  "num_grad_evals", "num_hvp_evals", "objective_trace", "info")
        return _fields_repr(self, fields, status=self.reason if np.ndim(self.status) == 0 else None)


def _bound_claim(claim) -> bool:
    if not isinstance(claim, (bool, np.bool_)):
        raise ValueError("Posterior: `bound_claim` (whether the method's log_z is a lower bound) must be a "
                         f"Python bool, got {type(claim).__name__}.")
    return bool(claim)


class Posterior(eqx.Module):
    """A Gaussian approximation q(w) = N(mean, S) of p(w) and an estimate of log Z.

    **Fields:** `mean` ``(D,)``; `factor`, the covariance-family factor holding S; `log_z`, differentiable in the
    model's hyperparameters: a lower bound for G-KL, mean field and LVB, an approximation for EP and Laplace, the
    log joint at the mode for MAP; `diagnostics`; `model`, the model fitted; `state`, the method's final State
    (``method.fit(model, post.state)`` restarts there); `bound_claim` (static), whether the method claims a bound.
    `defines_log_z` (class attribute) is False where the method gives no evidence (`vj.nn.NetworkPosterior`).
    """

    mean: jax.Array
    factor: AbstractFactor
    log_z: jax.Array
    diagnostics: Diagnostics
    model: LatentLinearModel
    bound_claim: bool = eqx.field(static=True, converter=_bound_claim)
    state: object = None
    defines_log_z: ClassVar[bool] = True

    @property
    def is_lower_bound(self):
        """The method's claim and a finite `log_z`: a Python bool when concrete, a bool array while traced."""
        if is_concrete(self.log_z) and np.ndim(self.log_z) == 0:
            return self.bound_claim and bool(np.isfinite(np.asarray(self.log_z)))
        return jnp.logical_and(self.bound_claim, jnp.isfinite(self.log_z))

    @property
    def covariance(self):
        """S as a dense ``(D, D)`` matrix (computed on access for structured families)."""
        return self.factor.dense()

    @property
    def std(self):
        """Marginal standard deviations √diag(S) of w under q, shape ``(D,)``."""
        return jnp.sqrt(self.factor.variances())

    def marginals(self, H):
        """Means and variances of ``H w`` under q, each ``(N,)``; ``H``: dense ``(N, D)``, BCOO, or `vj.Identity(D)`."""
        projection = as_projection(H)
        if projection.shape[1] != self.mean.shape[0]:
            raise ValueError(f"Posterior.marginals: H has {projection.shape[1]} columns, expected {self.mean.shape[0]}.")
        return projection.mv(self.mean), self.factor.projected_variances(projection)

    def sample(self, key, num_samples: int):
        """``num_samples`` draws from q: shape ``(num_samples, D)``."""
        return self.mean + self.factor.sample(key, num_samples)

    def summary(self, names=None, max_rows: int | None = None) -> str:
        """A table of q's mean and sd per coordinate (``names``, default ``w[i]``; the first ``max_rows``), with log Z.

        For a concrete, unbatched posterior (not under `jit` or `vmap`)."""
        if not is_concrete(self.mean, self.log_z):
            raise ValueError("Posterior.summary: the posterior is traced (inside jit, vmap or grad); "
                             "call summary() on the concrete result outside the transformation.")
        if np.ndim(self.mean) != 1:
            raise ValueError(f"Posterior.summary: mean has shape {np.shape(self.mean)}, a batch of posteriors "
                             "(from vmap); select one first, e.g. jax.tree.map(lambda x: x[0], post).")
        dim = int(np.shape(self.mean)[0])
        names = [f"w[{i}]" for i in range(dim)] if names is None else [str(n) for n in names]
        if len(names) != dim:
            raise ValueError(f"Posterior.summary: got {len(names)} names for {dim} coordinates; pass one "
                             "name per coordinate of the mean, or None.")
        mean, std = np.asarray(self.mean), np.asarray(self.std)
        shown = dim if max_rows is None else min(dim, int(max_rows))
        d = self.diagnostics
        log_z = float(self.log_z)
        if bool(self.is_lower_bound):
            kind = "a lower bound on log Z"
        elif not self.defines_log_z:
            kind = "not defined by this method"
        elif not np.isfinite(log_z):
            kind = "not finite: the fit failed"
        elif d.method == "MAP":
            kind = "the log joint at the mode, not an evidence estimate"
        else:
            kind = "an approximation of log Z"
        status = "converged" if bool(np.all(d.converged)) else f"NOT converged ({d.reason})"
        width = max([len("coordinate")] + [len(n) for n in names[:shown]])
        lines = [f"{d.method} ({d.solver}): {status} after {int(d.iterations)} iterations",
                 f"log Z = {log_z:.6g} ({kind})",
                 f"{'coordinate':<{width}}  {'mean':>12}  {'sd':>12}"]
        lines += [f"{names[i]:<{width}}  {mean[i]:>12.5g}  {std[i]:>12.5g}" for i in range(shown)]
        if shown < dim:
            lines.append(f"... {dim - shown} more coordinates")
        return "\n".join(lines)

    def __repr__(self):
        if not is_concrete(self.mean, self.log_z, self.diagnostics):
            return super().__repr__()
        factor = type(self.factor).__name__
        return (f"Posterior(mean={_show(self.mean)}, factor={factor}, log_z={_show(self.log_z)}, "
                f"is_lower_bound={_show(self.is_lower_bound)}, diagnostics={_show(self.diagnostics)}, "
                f"model={type(self.model).__name__}, state={_show(self.state)})")


class Mixture(eqx.Module):
    """A mixture of posteriors over hyperparameters θ: points θ_k, weights w_k (summing to 1) and the fit q_k at each.

    The base of `vj.hyper.Integration` and `vj.hyper.Samples`: ``points`` ``(K, P)``, ``weights`` ``(K,)`` and
    ``posteriors``, one `Posterior` whose leaves have a leading axis K; the GP and GLM predictives `mix` over it.
    """

    points: eqx.AbstractVar[jax.Array]
    weights: eqx.AbstractVar[jax.Array]
    posteriors: eqx.AbstractVar[Posterior]

    @property
    def mean(self) -> jax.Array:
        """E[θ] = Σ_k w_k θ_k, shape ``(P,)``."""
        return self.weights @ self.points

    @property
    def sd(self) -> jax.Array:
        """The standard deviation of θ under the weights, shape ``(P,)``."""
        return jnp.sqrt(self.weights @ (self.points - self.mean) ** 2)

    def mix(self, predictive, *args, combine: str = "mean"):
        """``predictive(q_k, *args)`` at every point, combined with the weights (vmapped in batches of 16).

        ``combine``: ``"mean"`` (Σ_k w_k f_k), ``"log"`` (log Σ_k w_k exp(f_k): log densities) or ``"moments"``
        (``predictive`` returns (m_k, v_k); the result is (Σ_k w_k m_k, Σ_k w_k (v_k + (m_k − m̄)²)))."""
        if combine not in ("mean", "log", "moments"):
            raise ValueError(f"Mixture.mix: `combine` must be 'mean', 'log' or 'moments', got {combine!r}.")
        return _mixed(predictive, combine, self.posteriors, self.weights, args)


@eqx.filter_jit
def _mixed(predictive, combine, posteriors, weights, args):
    values = batched_map(lambda post: predictive(post, *args), posteriors, min(weights.shape[0], 16))
    if combine == "mean":
        return jnp.tensordot(weights, values, axes=1)
    if combine == "log":
        log_w = jnp.log(weights).reshape(weights.shape + (1,) * (values.ndim - 1))
        return jax.nn.logsumexp(values + log_w, axis=0)
    means, variances = values
    mean = jnp.tensordot(weights, means, axes=1)
    return mean, jnp.tensordot(weights, variances + (means - mean) ** 2, axes=1)
