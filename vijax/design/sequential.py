"""Sequential Bayesian experimental design for the sparse linear model (thesis §5.4): fit q(w) = N(m, S),
choose the next block of rows M*, measure y* and refit, warm-started."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks, potentials
from ..covariance import Full
from ..inference import infer
from ..methods import EP, GKL, MAP, AbstractMethod, Laplace
from ..padding import pad_sites
from ..posterior import Posterior
from ..solvers import NewtonCG
from . import criteria
from .model import ep_sites, smoothed_laplace, sparse_linear_model

__all__ = ["sequential", "SequentialResult", "random_rows", "design_method", "FIT_TOL"]

_OWNER = "design.sequential"
_DESIGNS = ("free", "greedy", "random")
FIT_TOL = 1e-6  # the default Newton tolerance of a design loop's G-KL fits (see `design_method`)


def design_method(method: AbstractMethod, fit_tol: float | None = FIT_TOL) -> AbstractMethod:
    """``method`` as `sequential` runs it: a `vj.GKL` with no `solver` and a concave family other than `Full`
    gets ``vj.solvers.NewtonCG(tol=fit_tol)``; anything else, or all when ``fit_tol`` is None, is unchanged.

    A design step needs only the mean and S's leading eigenvectors, which settle well before NewtonCG's own
    1e-10 (docs/benchmarks.md); use ``fit_tol=None`` when ``log_z`` or its gradients matter.
    """
    if (fit_tol is None or not isinstance(method, GKL) or method.solver is not None
            or not method.covariance.concave or isinstance(method.covariance, Full)):
        return method
    return dataclasses.replace(method, solver=NewtonCG(tol=float(fit_tol)))


class SequentialResult(NamedTuple):
    """What a design run did, one entry per fit (S steps give S + 1 fits) unless said otherwise.

    - `num_measurements`: N at each fit, shape ``(S + 1,)``; `errors`: ‖m − w_true‖₂ (NaN without ``truth``).
    - `fit_times`, `fit_cpu_times`: wall-clock and process CPU seconds of each fit (the first compiles).
    - `design_times`, `gains`: seconds to choose each block and its information gain, ``(S,)``.
    - `converged`: each fit's ``diagnostics.converged``.
    - `rows`, `y`: all measurements at the end, ``(N_S, D)`` and ``(N_S,)``.
    - `posterior`: the last fit (its model padded when ``pad`` was on).
    - `means`: each fit's mean, ``(S + 1, D)``, when ``keep_means=True``, else None.
    """

    num_measurements: np.ndarray
    errors: np.ndarray
    fit_times: np.ndarray
    design_times: np.ndarray
    gains: np.ndarray
    converged: np.ndarray
    rows: np.ndarray
    y: np.ndarray
    posterior: Posterior
    means: np.ndarray | None = None
    fit_cpu_times: np.ndarray | None = None

    def summary(self) -> str:
        """A table: measurements, ℓ2 error and fit time per step."""
        lines = [f"{'N':>6}  {'l2 error':>10}  {'fit s':>8}  {'gain':>8}"]
        for k, n in enumerate(self.num_measurements):
            gain = f"{self.gains[k]:8.3f}" if k < len(self.gains) else f"{'':>8}"
            lines.append(f"{int(n):>6}  {self.errors[k]:>10.4g}  {self.fit_times[k]:>8.3f}  {gain}")
        return "\n".join(lines)


def random_rows(key, num_rows: int, dim: int, dtype=None):
    """``num_rows`` standard-normal rows scaled to unit norm: shape ``(num_rows, dim)``."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    rows = jax.random.normal(key, (num_rows, dim), dtype)
    return rows / jnp.linalg.norm(rows, axis=1, keepdims=True)


def sequential(M, y, noise_variance, B, prior, method: AbstractMethod, num_steps: int, *, rows_per_step: int = 1,
               design: str = "free", truth=None, measure: Callable | None = None, candidates=None, key=None,
               num_lanczos: int | None = None, warm_start: bool = True, pad: bool = True,
               map_smoothing: float | None = 1e-2, fit_tol: float | None = FIT_TOL, keep_means: bool = False,
               callback: Callable | None = None) -> SequentialResult:
    """Run ``num_steps`` steps of fit → design → measure → refit on `sparse_linear_model`.

    **Arguments:**

    - `M`, `y`, `noise_variance`, `B`, `prior`: the starting model (`sparse_linear_model`), M dense ``(N_0, D)``.
    - `method`: any vijax method (`vj.GKL(covariance=vj.covariance.Chevron(80))`, `vj.LVB()`, `vj.MAP()`, …).
    - `num_steps`: S, the number of blocks to add; `rows_per_step`: K, rows per block.
    - `design`: ``"free"``: S's K leading eigenvectors (`free_design` with ``num_lanczos`` steps);
      ``"greedy"``: K unused rows of ``candidates`` ``(C, D)`` by `greedy_rows`; ``"random"``: the baseline.
    - `truth`: the true w (D,), to simulate y* = M* w + N(0, ν² I) and report ℓ2 errors; or `measure`:
      a function ``rows (K, D) -> y* (K,)``.
    - `key`: for random rows, Lanczos starts and noise (default PRNGKey(0)).
    - `warm_start`: refit from the last posterior's State (EP: `ep_sites`).
    - `pad`: pad the measurement sites to the final N (`vj.pad_sites`): all fits share one compiled program.
    - `map_smoothing`: `vj.MAP` and `vj.Laplace` fit a Laplace prior as `smoothed_laplace(τ, map_smoothing)`.
    - `fit_tol`: the Newton tolerance of `vj.GKL` fits (`design_method`).
    - `keep_means`: keep every fit's mean; `callback(step, posterior)`: called after each fit.

    **Returns:** a `SequentialResult`.
    """
    if not isinstance(method, AbstractMethod):
        raise ValueError(f"{_OWNER}: `method` must be a vijax method instance such as vj.GKL(), got {method!r}.")
    if design not in _DESIGNS:
        raise ValueError(f"{_OWNER}: `design` must be one of {_DESIGNS}, got {design!r}.")
    if (truth is None) == (measure is None):
        raise ValueError(f"{_OWNER}: give exactly one of `truth` (to simulate measurements) and `measure` "
                         "(a function rows -> y*).")
    num_steps = _checks.integer("num_steps", num_steps, _OWNER, 0)
    rows_per_step = _checks.integer("rows_per_step", rows_per_step, _OWNER)
    if design == "greedy":
        if candidates is None:
            raise ValueError(f"{_OWNER}: design='greedy' picks rows from `candidates`, a (C, D) array; give one.")
        candidates = jnp.asarray(candidates)
        if candidates.shape[0] < num_steps * rows_per_step:
            raise ValueError(f"{_OWNER}: {candidates.shape[0]} candidates cannot supply {num_steps} steps of "
                             f"{rows_per_step} rows; give more candidates or take fewer steps.")
    if fit_tol is not None and not (isinstance(fit_tol, (float, int)) and not isinstance(fit_tol, bool) and fit_tol > 0):
        raise ValueError(f"{_OWNER}: `fit_tol` must be a positive number or None, got {fit_tol!r}.")
    method = design_method(method, fit_tol)
    key = jax.random.PRNGKey(0) if key is None else key
    rows = np.asarray(M, dtype=np.result_type(float) if not hasattr(M, "dtype") else M.dtype)
    values = np.asarray(y, dtype=rows.dtype)
    dim = sparse_linear_model(rows, values, noise_variance, B, prior).dim  # validates the inputs
    nu2 = float(noise_variance)
    if truth is not None:
        truth = np.asarray(truth, rows.dtype)
        if truth.shape != (dim,):
            raise ValueError(f"{_OWNER}: `truth` must have shape ({dim},), got {truth.shape}.")
    fit_prior = prior
    if (map_smoothing is not None and isinstance(method, (MAP, Laplace))
            and isinstance(prior, potentials.Laplace)):
        fit_prior = smoothed_laplace(prior.scale, map_smoothing)  # made once: one compiled fit for every step
    final = rows.shape[0] + num_steps * rows_per_step
    available = np.ones(0 if candidates is None else candidates.shape[0], bool)

    errors, fit_times, cpu_times, design_times, gains, counts, converged, means = ([] for _ in range(8))

    def fit(previous, step):
        model = sparse_linear_model(rows, values, noise_variance, B, fit_prior)
        model = pad_sites(model, size=(final, None)) if pad else model
        start, start_cpu = time.perf_counter(), time.process_time()
        init = previous if warm_start else None
        if isinstance(method, EP):  # its Laplace start is improper while N < D
            init = ep_sites(model, None if init is None else init.state)
        post = infer(model, method, init=init)
        jax.block_until_ready(post.mean)
        fit_times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - start_cpu)
        mean = np.asarray(post.mean)
        errors.append(float(np.linalg.norm(mean - truth)) if truth is not None else float("nan"))
        counts.append(rows.shape[0])
        converged.append(bool(np.all(np.asarray(post.diagnostics.converged))))
        if keep_means:
            means.append(mean)
        if callback is not None:
            callback(step, post)
        return post

    post = fit(None, 0)
    for step in range(num_steps):
        key, k_design, k_noise = jax.random.split(key, 3)
        start = time.perf_counter()
        gain = None
        if design == "free":
            new, ritz = criteria.free_design(post, rows_per_step, num_lanczos, k_design)
            gain = 0.5 * float(jnp.sum(jnp.log1p(ritz / nu2)))  # Ritz vectors: M* S M*ᵀ = diag(ritz)
        elif design == "random":
            new = random_rows(k_design, rows_per_step, dim, rows.dtype)
        else:
            pool = np.flatnonzero(available)
            idx, _ = criteria.greedy_rows(post, candidates[pool], rows_per_step, nu2)
            chosen = pool[np.asarray(idx)]
            available[chosen] = False
            new = candidates[chosen]
        new = np.asarray(new, rows.dtype)
        gains.append(float(criteria.information_gain(post, new, nu2)) if gain is None else gain)
        design_times.append(time.perf_counter() - start)
        if truth is not None:
            noise = np.asarray(jax.random.normal(k_noise, (rows_per_step,), rows.dtype)) * np.sqrt(nu2)
            observed = new @ truth + noise
        else:
            observed = np.asarray(measure(new), rows.dtype).reshape(rows_per_step)
        rows, values = np.concatenate([rows, new]), np.concatenate([values, observed])
        post = fit(post, step + 1)
    return SequentialResult(np.asarray(counts), np.asarray(errors), np.asarray(fit_times), np.asarray(design_times),
                            np.asarray(gains), np.asarray(converged), rows, values, post,
                            np.stack(means) if keep_means else None, np.asarray(cpu_times))
