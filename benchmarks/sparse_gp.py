"""Sparse GPs on N = 50,000 points: vijax's collapsed and SVGP bounds against GPJax's SVGP, same run.

A benchmark script, not a test. Synthetic data (numpy seed 0), x ~ U[−2, 2]², squared-exponential
ARD kernel k(x, x') = v · exp(−½ Σ_j (x_j − x'_j)² / ℓ_j²), zero mean, jitter 1e-6 on K_ZZ in both
libraries (``vj.gp.kernels.SquaredExponential`` / ``gpx.kernels.RBF`` under ``gpx.gps.Prior(jitter=1e-6)``):

- ``regression``: y = sin(3 x₁) + 0.5 cos(2 x₂) + 0.3 ε, ε ~ N(0, 1);
- ``classification``: y = sign(g(x) + 0.4 ε), g(x) = sin(2 x₁) + 0.8 x₂² − 1 + 0.5 x₁ x₂, ε ~ N(0, 1)
  (a probit-noise latent); probit likelihood p(y | f) = Φ(y f).

N = 50,000 training and 5,000 test points (``--quick``: 5,000 and 1,000), M ∈ {100, 200, 500}
inducing points (``--quick``: 50), initialised at the same random subset of the training inputs for
every method; initial ℓ = (1, 1), v = 1, noise s.d. σ = 0.5 (regression).

Methods (per task and M):

- ``vijax collapsed`` (regression only): ``vj.gp.collapsed_elbo`` (Titsias) maximised over ℓ, v, σ and
  the inducing inputs Z by full-batch Adam (``--collapsed-lr``, default 0.05) for ``--collapsed-iters``
  iterations (default 40; ``--quick``: 20). One iteration sees all the data, so s/epoch is the time per
  iteration. Predictions from ``vj.gp.optimal_inducing_posterior`` + ``vj.gp.predict_sparse``.
- ``GPJax collapsed`` (regression only): the same with ``gpx.variational_families.CollapsedVariationalGaussian``
  and ``gpx.objectives.collapsed_elbo``; predictions from ``q.condition(D)(X_test, covariance="diagonal")``.
- ``vijax SVGP``: ``vj.gp.svgp_elbo`` with q(u) = N(m, RRᵀ) (unwhitened, initialised at m = 0, R = I), each
  step one natural-gradient step on q(u) (``vj.gp.svgp_natural_step``, ρ = ``--natgrad-lr``, default 0.1)
  followed by one Adam step (``--adam-lr``, default 0.01) on (log ℓ, log v, log σ, Z) against −ELBO on
  the same minibatch. Minibatches of ``--batch-size`` (default 1,000) from a fresh permutation of the
  training set every epoch (50 steps per epoch at N = 50,000), ``--epochs`` epochs (default 5; ``--quick``: 2).
  Likelihoods: ``vj.potentials.Gaussian(loc=y_batch, scale=σ)``; for classification
  ``vj.potentials.Probit()`` acting on y_n f_n. The script folds the labels in with a small wrapper,
  ``expected_log_phi(μ, s) = Probit().expected_log_phi(y ⊙ μ, s)`` (checked against direct
  Gauss–Hermite quadrature at start-up), which is what ``labels=`` of ``svgp_elbo`` /
  ``svgp_natural_step`` does.
- ``vijax SVGP clip`` (classification only): the same with GPJax's likelihood instead of the exact probit,
  p(y | f) = (1 − 2·10⁻³) Φ(y f) + 10⁻³ with its expectation by 20-node Gauss–Hermite (as GPJax's ``Bernoulli``
  computes it), so that this row and ``GPJax SVGP`` fit the same model with the same algorithm.
- ``GPJax SVGP``: ``gpx.variational_families.VariationalGaussian`` (unwhitened, GPJax's defaults m = 0,
  R = I) with ``gpx.likelihoods.Gaussian`` / ``gpx.likelihoods.Bernoulli`` (GPJax's Bernoulli is a probit
  link clipped to [1e-3, 1 − 1e-3]), objective ``-gpx.objectives.elbo``, trained by GPJax's own
  NGD + Adam scheme: each step is exactly the body of ``gpx.fit_natgrads`` —
  ``gpjax.natural_gradients.natural_gradient_step`` on (m, R) (ρ = ``--natgrad-lr``, with its step-size
  back-off), then an Adam step on the hyperparameter partition (kernel, likelihood, Z), on the same
  minibatches as vijax (``gpx.fit_natgrads`` draws its batches with replacement inside one scan and
  re-initialises Adam on every call, so it cannot be timed per epoch; the step is reproduced instead,
  run in the same scan and jit as vijax's). GPJax stores positive parameters through softplus, vijax
  through log, so Adam takes different paths from the same starting values.

Timing: every method's epoch is one ahead-of-time compiled ``jax.jit`` function of the arrays of the
state (``jax.lax.scan`` over that epoch's minibatches; collapsed: one iteration), so compilation is
excluded and reported separately (``compile s``); each epoch is timed with ``jax.block_until_ready``,
and ``s/epoch`` is the median over epochs. Test metrics are evaluated after every epoch (outside the
timed region; collapsed: every ``--collapsed-eval`` iterations) with the *same* formulas for both
libraries from each library's latent predictive mean m* and variance v*:
regression: test log-lik = mean log N(y* | m*, v* + σ²) and RMSE of m*;
classification: test log-lik = mean log Φ(y* m* / √(1 + v*)) (exact probit, for both), accuracy of sign(m*).
``ELBO/N`` is the final bound on the full training set divided by N (SVGP: the full-data ELBO,
evaluated in equal chunks; collapsed: the Titsias bound).

Start-up checks (small problem, N = 300, M = 7), printed first: vijax's and GPJax's SVGP ELBOs at identical
parameters (regression: they differ only by GPJax's jitter 1e-6 added to the marginal variances of q(f_n);
classification: by GPJax's probit clipping, a different likelihood), one natural-gradient step of each from the
same q(u) (regression; agreement to rounding), vijax's ELBO with the clipped probit against GPJax's, and the
label-folding wrapper against direct quadrature.

Run it pinned to one core (this machine has 2 cores and is shared; both libraries run in the same
process, one after the other, so their timings are comparable with each other, not across runs)::

    taskset -c 1 python benchmarks/sparse_gp.py            # N = 50,000, M = 100, 200, 500, 5 epochs
    taskset -c 1 python benchmarks/sparse_gp.py --quick    # N = 5,000, M = 50, 2 epochs

Float64 is switched on by this script. Writes ``benchmarks/results/sparse_gp[_quick].txt`` and ``.json``
and a plot of test log-lik against cumulative training time, ``sparse_gp[_quick].png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import sys
import time
import traceback

import jax

jax.config.update("jax_enable_x64", True)
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.special import log_ndtr

import vijax as vj

from _common import RESULTS, Tee, timed

JITTER = 1e-6
INIT = dict(lengthscale=1.0, variance=1.0, noise_sd=0.5)
METHODS = ("vijax collapsed", "GPJax collapsed", "vijax SVGP", "vijax SVGP clip", "GPJax SVGP")


# ------------------------------------------------------------------------------------------ data
def make_data(task, n_train, n_test, seed=0):
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = rng.uniform(-2, 2, size=(n, 2))
    if task == "regression":
        y = np.sin(3 * x[:, 0]) + 0.5 * np.cos(2 * x[:, 1]) + 0.3 * rng.normal(size=n)
    else:
        g = np.sin(2 * x[:, 0]) + 0.8 * x[:, 1] ** 2 - 1 + 0.5 * x[:, 0] * x[:, 1]
        y = np.where(g + 0.4 * rng.normal(size=n) > 0, 1.0, -1.0)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


# ----------------------------------------------------------------------------------------- metrics
def test_metrics(task, mean, var, y_test, noise_var=None):
    """(test log-lik, RMSE or accuracy) from a latent predictive, the same formula for every method."""
    mean, var, y_test = (np.asarray(a, float) for a in (mean, var, y_test))
    if task == "regression":
        total = var + noise_var
        ll = -0.5 * (np.log(2 * np.pi * total) + (y_test - mean) ** 2 / total)
        return float(ll.mean()), float(np.sqrt(np.mean((y_test - mean) ** 2)))
    ll = np.asarray(log_ndtr(jnp.asarray(y_test * mean / np.sqrt(1 + var))))
    return float(ll.mean()), float(np.mean(np.sign(mean) == y_test))


class SignedProbit(eqx.Module):
    """Probit on y_n f_n for svgp_elbo / svgp_natural_step, which only call ``expected_log_phi``."""

    signs: jax.Array

    def expected_log_phi(self, mu, sigma):
        return vj.potentials.Probit().expected_log_phi(self.signs * mu, sigma)


class ClippedProbit(eqx.Module):
    """GPJax's Bernoulli likelihood for vijax's SVGP: p(y | f) = (1 − 2c) Φ(y f) + c, c = 1e-3, its expectation by
    20-node Gauss–Hermite (GPJax's ``Bernoulli`` with its default ``GHQuadratureIntegrator(num_points=20)``)."""

    signs: jax.Array

    def expected_log_phi(self, mu, sigma):
        z, w = np.polynomial.hermite_e.hermegauss(20)
        f = (self.signs * mu)[..., None] + sigma[..., None] * z
        return jnp.log((1 - 2e-3) * jax.scipy.stats.norm.cdf(f) + 1e-3) @ (w / np.sqrt(2 * np.pi))


def vj_likelihood(task, hyp, y, clipped=False):
    if task == "regression":
        return vj.potentials.Gaussian(loc=y, scale=jnp.exp(hyp["log_sigma"]))
    return ClippedProbit(y) if clipped else SignedProbit(y)


# ------------------------------------------------------------------------------- compiled epochs
class Compiled:
    """An epoch function of a pytree state, compiled ahead of time on the state's arrays."""

    def __init__(self, fn, state, *args):
        dyn, self.static = eqx.partition(state, eqx.is_array)

        def run(dyn, *args):
            out = fn(eqx.combine(dyn, self.static), *args)
            new_dyn, _ = eqx.partition(out, eqx.is_array)
            return new_dyn

        self.exe, (self.compile_s,) = timed(lambda: jax.jit(run).lower(dyn, *args).compile())

    def __call__(self, state, *args):
        dyn, _ = eqx.partition(state, eqx.is_array)
        return eqx.combine(jax.block_until_ready(self.exe(dyn, *args)), self.static)


def epoch_batches(rng, n, batch_size):
    steps = n // batch_size
    return jnp.asarray(rng.permutation(n)[: steps * batch_size].reshape(steps, batch_size))


# ------------------------------------------------------------------------------------------ vijax
def vj_hyper(task, d, Z0):
    hyp = dict(kernel=vj.gp.kernels.SquaredExponential(lengthscale=jnp.full(d, INIT["lengthscale"]),
                                                       variance=INIT["variance"]),
               Z=jnp.asarray(Z0))
    if task == "regression":
        hyp["log_sigma"] = jnp.log(jnp.asarray(INIT["noise_sd"]))
    return hyp


def run_vijax_svgp(task, data, Z0, args, log_epoch, clipped=False):
    X, y, Xt, yt = (jnp.asarray(a) for a in data)
    N, M = X.shape[0], Z0.shape[0]
    adam = optax.adam(args.adam_lr)
    hyp = vj_hyper(task, X.shape[1], Z0)
    state = dict(mean_u=jnp.zeros(M), chol_u=jnp.eye(M), hyp=hyp, opt=adam.init(eqx.filter(hyp, eqx.is_array)))

    def step(state, idx):
        Xb, yb = X[idx], y[idx]
        hyp = state["hyp"]
        mean_u, chol_u = vj.gp.svgp_natural_step(state["mean_u"], state["chol_u"], hyp["kernel"], hyp["Z"], Xb,
                                                 vj_likelihood(task, hyp, yb, clipped), num_data=N,
                                                 learning_rate=args.natgrad_lr, jitter=JITTER)

        def loss(hyp):
            return -vj.gp.svgp_elbo(mean_u, chol_u, hyp["kernel"], hyp["Z"], Xb, vj_likelihood(task, hyp, yb, clipped),
                                    num_data=N, jitter=JITTER)

        value, grads = eqx.filter_value_and_grad(loss)(hyp)
        updates, opt = adam.update(grads, state["opt"], eqx.filter(hyp, eqx.is_array))
        return dict(mean_u=mean_u, chol_u=chol_u, hyp=eqx.apply_updates(hyp, updates), opt=opt), value

    def epoch(state, batches):
        return jax.lax.scan(step, state, batches)[0]

    @jax.jit
    def predict(state):
        hyp = state["hyp"]
        R = jnp.tril(state["chol_u"])
        return vj.gp.predict_sparse(hyp["kernel"], hyp["Z"], state["mean_u"], R @ R.T, Xt, jitter=JITTER)

    @jax.jit
    def full_elbo(state):
        hyp = state["hyp"]
        chunks = jnp.arange(N).reshape(args.elbo_chunks, -1)
        per = jax.lax.map(lambda idx: vj.gp.svgp_elbo(state["mean_u"], state["chol_u"], hyp["kernel"], hyp["Z"],
                                                      X[idx], vj_likelihood(task, hyp, y[idx], clipped), num_data=N,
                                                      jitter=JITTER), chunks)
        return jnp.mean(per)

    def evaluate(state):
        mean, var = predict(state)
        nv = float(jnp.exp(2 * state["hyp"]["log_sigma"])) if task == "regression" else None
        return test_metrics(task, mean, var, yt, nv)

    return train_epochs(state, epoch, evaluate, lambda s: float(full_elbo(s)) / N, N, args, log_epoch,
                        hyper=lambda s: vj_hyper_values(s["hyp"]))


def vj_hyper_values(hyp):
    out = dict(lengthscale=np.asarray(hyp["kernel"].lengthscale).round(4).tolist(),
               variance=round(float(hyp["kernel"].variance), 4))
    if "log_sigma" in hyp:
        out["noise_sd"] = round(float(jnp.exp(hyp["log_sigma"])), 4)
    return out


def run_vijax_collapsed(task, data, Z0, args, log_epoch):
    X, y, Xt, yt = (jnp.asarray(a) for a in data)
    N = X.shape[0]
    adam = optax.adam(args.collapsed_lr)
    hyp = vj_hyper(task, X.shape[1], Z0)
    state = dict(hyp=hyp, opt=adam.init(eqx.filter(hyp, eqx.is_array)))

    def bound(hyp):
        return vj.gp.collapsed_elbo(hyp["kernel"], X, y, jnp.exp(2 * hyp["log_sigma"]), hyp["Z"], jitter=JITTER)

    def iteration(state):
        value, grads = eqx.filter_value_and_grad(lambda h: -bound(h))(state["hyp"])
        updates, opt = adam.update(grads, state["opt"], eqx.filter(state["hyp"], eqx.is_array))
        return dict(hyp=eqx.apply_updates(state["hyp"], updates), opt=opt)

    @jax.jit
    def predict(hyp):
        nv = jnp.exp(2 * hyp["log_sigma"])
        mu, cov = vj.gp.optimal_inducing_posterior(hyp["kernel"], X, y, nv, hyp["Z"], jitter=JITTER)
        return vj.gp.predict_sparse(hyp["kernel"], hyp["Z"], mu, cov, Xt, jitter=JITTER)

    def evaluate(state):
        mean, var = predict(state["hyp"])
        return test_metrics(task, mean, var, yt, float(jnp.exp(2 * state["hyp"]["log_sigma"])))

    return train_iterations(state, iteration, evaluate, lambda s: float(jax.jit(bound)(s["hyp"])) / N, args,
                            log_epoch, hyper=lambda s: vj_hyper_values(s["hyp"]))


# ------------------------------------------------------------------------------------------ GPJax
def gpx_model(task, d, Z0, collapsed=False):
    import gpjax as gpx

    kernel = gpx.kernels.RBF(lengthscale=jnp.full(d, INIT["lengthscale"]), variance=INIT["variance"])
    prior = gpx.gps.Prior(mean_function=gpx.mean_functions.Zero(), kernel=kernel, jitter=JITTER)
    lik = (gpx.likelihoods.Gaussian(obs_stddev=INIT["noise_sd"]) if task == "regression"
           else gpx.likelihoods.Bernoulli())
    family = (gpx.variational_families.CollapsedVariationalGaussian if collapsed
              else gpx.variational_families.VariationalGaussian)
    return family(model=prior * lik, inducing_inputs=jnp.asarray(Z0))


def gpx_targets(task, y):
    y = jnp.asarray(y)[:, None]
    return y if task == "regression" else (y + 1) / 2   # GPJax's Bernoulli takes {0, 1}


def gpx_hyper_values(q):
    from gpjax.parameters import val

    k, lik = q.model.prior.kernel, q.model.likelihood
    out = dict(lengthscale=np.asarray(val(k.lengthscale)).round(4).tolist(), variance=round(float(val(k.variance)), 4))
    if hasattr(lik, "obs_stddev"):
        out["noise_sd"] = round(float(val(lik.obs_stddev)), 4)
    return out


def run_gpjax_svgp(task, data, Z0, args, log_epoch):
    import gpjax as gpx
    from gpjax.natural_gradients import natural_gradient_step, partition_variational

    X, y, Xt, yt = (jnp.asarray(a) for a in data)
    Y = gpx_targets(task, y)
    N = X.shape[0]
    q = gpx_model(task, X.shape[1], Z0)
    objective = lambda q, d: -gpx.objectives.elbo(q, d)
    adam = optax.adam(args.adam_lr)
    variational, hyper = partition_variational(q)
    state = dict(variational=variational, hyper=hyper, opt=adam.init(eqx.filter(hyper, eqx.is_array)))
    rho = jnp.asarray(args.natgrad_lr)

    def step(state, idx):                     # the body of gpx.fit_natgrads' scan
        batch = gpx.Dataset(X=X[idx], y=Y[idx], n_total=N)
        variational, value = natural_gradient_step(state["variational"], state["hyper"], batch, objective, rho)
        grads = eqx.filter_grad(lambda h: objective(eqx.combine(variational, h), batch))(state["hyper"])
        updates, opt = adam.update(grads, state["opt"], eqx.filter(state["hyper"], eqx.is_array))
        return dict(variational=variational, hyper=eqx.apply_updates(state["hyper"], updates), opt=opt), value

    def epoch(state, batches):
        return jax.lax.scan(step, state, batches)[0]

    qof = lambda s: eqx.combine(s["variational"], s["hyper"])

    @eqx.filter_jit
    def predict(q):
        pred = q.condition(None)(Xt, covariance="diagonal")
        return pred.mean, pred.variance

    @eqx.filter_jit
    def full_elbo(q):
        chunks = jnp.arange(N).reshape(args.elbo_chunks, -1)
        per = jax.lax.map(lambda idx: gpx.objectives.elbo(q, gpx.Dataset(X=X[idx], y=Y[idx], n_total=N)), chunks)
        return jnp.mean(per)

    def evaluate(state):
        q = qof(state)
        mean, var = predict(q)
        from gpjax.parameters import val
        nv = float(val(q.model.likelihood.obs_stddev)) ** 2 if task == "regression" else None
        return test_metrics(task, mean, var, yt, nv)

    return train_epochs(state, epoch, evaluate, lambda s: float(full_elbo(qof(s))) / N, N, args, log_epoch,
                        hyper=lambda s: gpx_hyper_values(qof(s)))


def run_gpjax_collapsed(task, data, Z0, args, log_epoch):
    import gpjax as gpx

    X, y, Xt, yt = (jnp.asarray(a) for a in data)
    D = gpx.Dataset(X=X, y=gpx_targets(task, y))
    N = X.shape[0]
    q = gpx_model(task, X.shape[1], Z0, collapsed=True)
    adam = optax.adam(args.collapsed_lr)
    state = dict(q=q, opt=adam.init(eqx.filter(q, eqx.is_array)))
    loss = lambda q: -gpx.objectives.collapsed_elbo(q, D)

    def iteration(state):                     # the body of gpx.fit's scan, full batch
        grads = eqx.filter_grad(loss)(state["q"])
        updates, opt = adam.update(grads, state["opt"], eqx.filter(state["q"], eqx.is_array))
        return dict(q=eqx.apply_updates(state["q"], updates), opt=opt)

    @eqx.filter_jit
    def predict(q):
        pred = q.condition(D)(Xt, covariance="diagonal")
        return pred.mean, pred.variance

    def evaluate(state):
        from gpjax.parameters import val
        mean, var = predict(state["q"])
        return test_metrics(task, mean, var, yt, float(val(state["q"].model.likelihood.obs_stddev)) ** 2)

    return train_iterations(state, iteration, evaluate, lambda s: -float(eqx.filter_jit(loss)(s["q"])) / N,
                            args, log_epoch, hyper=lambda s: gpx_hyper_values(s["q"]))


# ---------------------------------------------------------------------------------- train loops
def _finite(*xs):
    return all(math.isfinite(x) for x in xs)


def train_epochs(state, epoch, evaluate, elbo, N, args, log_epoch, hyper):
    rng = np.random.default_rng(1)          # the same permutations for every method
    batches = epoch_batches(rng, N, args.batch_size)
    fn = Compiled(epoch, state, batches)
    curve, times, elapsed = [], [], 0.0
    ll0, m0 = evaluate(state)
    curve.append(dict(epoch=0, seconds=0.0, test_ll=ll0, metric=m0))
    for e in range(1, args.epochs + 1):
        if e > 1:
            batches = epoch_batches(rng, N, args.batch_size)
        state, (dt,) = timed(fn, state, batches)
        times.append(dt)
        elapsed += dt
        ll, m = evaluate(state)
        curve.append(dict(epoch=e, seconds=elapsed, test_ll=ll, metric=m))
        log_epoch(f"      epoch {e:>3}: {dt:7.2f} s  test ll {ll:9.4f}  metric {m:.4f}")
        if not _finite(ll, m):
            break
    return dict(compile_s=fn.compile_s, epoch_times=times, s_per_epoch=float(np.median(times)),
                steps_per_epoch=int(batches.shape[0]), elbo_per_n=elbo(state), test_ll=curve[-1]["test_ll"],
                metric=curve[-1]["metric"], curve=curve, hyper=hyper(state))


def train_iterations(state, iteration, evaluate, elbo, args, log_epoch, hyper):
    fn = Compiled(iteration, state)
    curve, times, elapsed = [], [], 0.0
    ll0, m0 = evaluate(state)
    curve.append(dict(epoch=0, seconds=0.0, test_ll=ll0, metric=m0))
    for it in range(1, args.collapsed_iters + 1):
        state, (dt,) = timed(fn, state)
        times.append(dt)
        elapsed += dt
        if it % args.collapsed_eval == 0 or it == args.collapsed_iters:
            ll, m = evaluate(state)
            curve.append(dict(epoch=it, seconds=elapsed, test_ll=ll, metric=m))
            log_epoch(f"      iter {it:>4}: {dt:7.2f} s  test ll {ll:9.4f}  metric {m:.4f}")
            if not _finite(ll, m):
                break
    return dict(compile_s=fn.compile_s, epoch_times=times, s_per_epoch=float(np.median(times)),
                steps_per_epoch=1, elbo_per_n=elbo(state), test_ll=curve[-1]["test_ll"], metric=curve[-1]["metric"],
                curve=curve, hyper=hyper(state))


RUNNERS = {"vijax collapsed": run_vijax_collapsed, "GPJax collapsed": run_gpjax_collapsed,
           "vijax SVGP": run_vijax_svgp, "GPJax SVGP": run_gpjax_svgp,
           "vijax SVGP clip": lambda *a: run_vijax_svgp(*a, clipped=True)}


# ------------------------------------------------------------------------------- start-up checks
def checks(log):
    """Start-up checks on a small problem (N = 300, M = 7): vijax's and GPJax's SVGP ELBO and one natural-gradient
    step from identical parameters, and the label-folding wrapper against direct quadrature."""
    import gpjax as gpx
    from gpjax.natural_gradients import natural_gradient_step, partition_variational
    from gpjax.parameters import LowerTriangular, Real, val

    out = {}
    rng = np.random.default_rng(5)
    M, n = 7, 300
    for task in ("regression", "classification"):
        X, y, _, _ = make_data(task, n, 1, seed=3)
        Z = X[rng.choice(n, M, replace=False)] + 0.1
        mean_u = 0.5 * rng.normal(size=M)
        R = np.tril(rng.normal(size=(M, M)) * 0.2, -1) + np.diag(rng.uniform(0.3, 1.0, M))
        hyp = vj_hyper(task, 2, Z)
        Xj, yj = jnp.asarray(X), jnp.asarray(y)
        lik = vj_likelihood(task, hyp, yj)
        v = float(vj.gp.svgp_elbo(jnp.asarray(mean_u), jnp.asarray(R), hyp["kernel"], hyp["Z"], Xj, lik, jitter=JITTER))
        q = gpx_model(task, 2, Z)
        q = eqx.tree_at(lambda t: (t.variational_mean, t.variational_root_covariance), q,
                        (Real(jnp.asarray(mean_u)[:, None]), LowerTriangular(jnp.asarray(R))))
        D = gpx.Dataset(X=Xj, y=gpx_targets(task, y))
        g = float(gpx.objectives.elbo(q, D))
        rec = dict(vijax=v, gpjax=g, diff=v - g)
        if task == "classification":
            vc = float(vj.gp.svgp_elbo(jnp.asarray(mean_u), jnp.asarray(R), hyp["kernel"], hyp["Z"], Xj,
                                       vj_likelihood(task, hyp, yj, clipped=True), jitter=JITTER))
            rec.update(vijax_clipped=vc, diff_clipped=vc - g)
            log(f"check: SVGP ELBO at identical parameters, classification, vijax with GPJax's clipped probit "
                f"(ClippedProbit): {vc:.8f}, difference to GPJax {vc - g:.2e} (GPJax's jitter on var q(f_n))")
        if task == "regression":
            # GPJax adds its jitter to the marginal variances of q(f_n): E log N(y | f, s^2) drops by jitter / (2 s^2)
            expected = n * JITTER / (2 * INIT["noise_sd"] ** 2)
            rec["expected_diff_from_gpjax_jitter"] = expected
            note = f" (expected from GPJax's jitter on var q(f_n): {expected:.2e})"
        else:
            note = " (GPJax's probit is clipped to [1e-3, 1 - 1e-3]; a different likelihood)"
        log(f"check: SVGP ELBO at identical parameters, {task} (N = {n}, M = {M}): vijax {v:.8f}, GPJax {g:.8f}, "
            f"difference {v - g:.2e}{note}")
        if task == "regression":
            m1, c1 = vj.gp.svgp_natural_step(jnp.asarray(mean_u), jnp.asarray(R), hyp["kernel"], hyp["Z"], Xj, lik,
                                             num_data=10 * n, learning_rate=0.1, jitter=JITTER)
            var, hy = partition_variational(q)
            var, _ = natural_gradient_step(var, hy, gpx.Dataset(X=Xj, y=D.y, n_total=10 * n),
                                           lambda q, d: -gpx.objectives.elbo(q, d), jnp.asarray(0.1))
            q2 = eqx.combine(var, hy)
            m2, c2 = val(q2.variational_mean).ravel(), val(q2.variational_root_covariance)
            dm, dS = float(jnp.max(jnp.abs(m1 - m2))), float(jnp.max(jnp.abs(c1 @ c1.T - c2 @ c2.T)))
            rec["natural_step"] = dict(max_abs_mean_diff=dm, max_abs_cov_diff=dS)
            log(f"check: one natural-gradient step (rho = 0.1, minibatch scaling 10x) from identical q(u): "
                f"max |mean diff| {dm:.1e}, max |cov diff| {dS:.1e}")
        out[f"elbo_{task}"] = rec
        if task == "classification":
            # direct quadrature of sum_n E log Phi(y_n f_n), f_n ~ N(m_n, v_n), 200-node Gauss-Hermite
            k, Zj = hyp["kernel"], hyp["Z"]
            m, var = vj.gp.predict_sparse(k, Zj, jnp.asarray(mean_u), jnp.asarray(R @ R.T), Xj, jitter=JITTER)
            z, w = np.polynomial.hermite_e.hermegauss(200)
            f = np.asarray(m)[:, None] + np.sqrt(np.asarray(var))[:, None] * z
            direct = float(np.sum(np.asarray(log_ndtr(jnp.asarray(y[:, None] * f))) @ w / np.sqrt(2 * np.pi)))
            folded = float(jnp.sum(SignedProbit(yj).expected_log_phi(m, jnp.sqrt(var))))
            out["label_folding"] = dict(wrapper=folded, direct=direct, diff=folded - direct)
            log(f"check: label folding, sum_n E log Phi(y_n f_n): wrapper {folded:.10f}, direct 200-node quadrature "
                f"{direct:.10f}, difference {folded - direct:.1e}")
    return out


# ------------------------------------------------------------------------------------------ main
def fmt_row(task, M, method, r):
    head = f"  {task:<14} {M:>4}  {method:<16}"
    if "error" in r:
        return head + f" FAILED: {r['error']}"
    metric = f"rmse {r['metric']:.4f}" if task == "regression" else f"acc {100 * r['metric']:.2f}%"
    nan = "" if _finite(r["test_ll"], r["elbo_per_n"]) else "  (non-finite)"
    return (head + f" {r['compile_s']:>9.2f} {r['s_per_epoch']:>9.3f} {r['elbo_per_n']:>10.4f} {r['test_ll']:>9.4f}  "
            f"{metric}{nan}")


def plot(records, path, tasks, Ms):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(len(tasks), len(Ms), figsize=(4.2 * len(Ms), 3.4 * len(tasks)), squeeze=False)
    styles = {"vijax collapsed": "C0--", "GPJax collapsed": "C1--", "vijax SVGP": "C0-", "GPJax SVGP": "C1-",
              "vijax SVGP clip": "C2:"}
    for i, task in enumerate(tasks):
        for j, M in enumerate(Ms):
            ax = axes[i, j]
            for rec in records:
                if rec["task"] != task or rec["M"] != M or "curve" not in rec:
                    continue
                c = [p for p in rec["curve"] if p["seconds"] > 0 and math.isfinite(p["test_ll"])]
                ax.plot([p["seconds"] for p in c], [p["test_ll"] for p in c], styles[rec["method"]], marker=".",
                        label=rec["method"])
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_title(f"{task}, M = {M}", fontsize=9)
            ax.set_xlabel("training time, s (compile excluded)", fontsize=8)
            ax.set_ylabel("test log-lik per point", fontsize=8)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 5,000, M = 50, 2 epochs, 20 collapsed iterations")
    parser.add_argument("--tasks", nargs="+", choices=("regression", "classification"),
                        default=["regression", "classification"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--M", nargs="+", type=int, default=None, help="numbers of inducing points")
    parser.add_argument("--n-train", type=int, default=None)
    parser.add_argument("--n-test", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--natgrad-lr", type=float, default=0.1)
    parser.add_argument("--adam-lr", type=float, default=0.01)
    parser.add_argument("--collapsed-iters", type=int, default=None)
    parser.add_argument("--collapsed-lr", type=float, default=0.05)
    parser.add_argument("--collapsed-eval", type=int, default=10, help="evaluate the collapsed fits every K iterations")
    parser.add_argument("--elbo-chunks", type=int, default=10, help="chunks for the final full-data SVGP ELBO")
    parser.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = parser.parse_args()
    q = args.quick
    args.M = args.M or ([50] if q else [100, 200, 500])
    args.n_train = args.n_train or (5000 if q else 50000)
    args.n_test = args.n_test or (1000 if q else 5000)
    args.epochs = args.epochs or (2 if q else 5)
    args.collapsed_iters = args.collapsed_iters or (20 if q else 40)
    if args.n_train % args.elbo_chunks:
        parser.error("--n-train must be divisible by --elbo-chunks")

    import gpjax as gpx

    start = time.perf_counter()
    log = Tee()

    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    log(f"vijax {vj.__version__}, GPJax {gpx.__version__}, jax {jax.__version__}, optax {optax.__version__}, "
        f"{platform.processor() or platform.machine()}, CPU affinity {affinity}, devices {jax.devices()}")
    log(f"N = {args.n_train} train, {args.n_test} test; M = {args.M}; SVGP: batch {args.batch_size}, "
        f"{args.epochs} epochs, natgrad lr {args.natgrad_lr}, Adam lr {args.adam_lr}; collapsed: "
        f"{args.collapsed_iters} full-batch Adam iterations, lr {args.collapsed_lr}")
    check_results = checks(log)

    records = []
    header = (f"  {'task':<14} {'M':>4}  {'method':<16} {'compile s':>9} {'s/epoch':>9} {'ELBO/N':>10} "
              f"{'test ll':>9}  rmse/accuracy")
    for task in args.tasks:
        data = make_data(task, args.n_train, args.n_test)
        for M in args.M:
            Z0 = data[0][np.random.default_rng(2).choice(args.n_train, M, replace=False)]
            for method in args.methods:
                if ("collapsed" in method and task != "regression") or (method.endswith("clip")
                                                                         and task != "classification"):
                    continue
                log(f"\n{task}, M = {M}, {method}:")
                rec = dict(task=task, M=M, method=method)
                try:
                    rec.update(RUNNERS[method](task, data, Z0, args, log))
                except Exception as exc:  # recorded, not dropped
                    rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                    rec["traceback"] = traceback.format_exc()[-3000:]
                    log(f"    FAILED: {rec['error']}")
                records.append(rec)
                log("  " + header.strip())
                log(fmt_row(task, M, method, rec))
                if "hyper" in rec:
                    log(f"    final hyperparameters: {rec['hyper']}")

    wall = time.perf_counter() - start
    log("\n" + "=" * 100)
    log(f"Sparse GP benchmark: N = {args.n_train}, {args.n_test} test points; SVGP {args.epochs} epochs of "
        f"{args.n_train // args.batch_size} steps (batch {args.batch_size}); collapsed {args.collapsed_iters} "
        "iterations (1 iteration = 1 epoch)")
    log(header)
    log("  " + "-" * 98)
    for rec in records:
        log(fmt_row(rec["task"], rec["M"], rec["method"], rec))
    log("\ncompile s: ahead-of-time compilation of one epoch (SVGP: lax.scan over its minibatches; collapsed: one "
        "iteration);\ns/epoch: median over epochs, compilation excluded; ELBO/N: final full-training-set bound / N; "
        "test ll: mean log predictive\ndensity per test point (regression: log N(y | m, v + s^2); classification: "
        "log Phi(y m / sqrt(1 + v))), the same formula for both libraries.")
    log(f"wall time {wall:.0f} s")

    outdir = pathlib.Path(args.out) if args.out else RESULTS
    outdir.mkdir(exist_ok=True)
    stem = f"sparse_gp{'_quick' if q else ''}"
    log.save(stem, outdir, header=" ".join(sys.argv))
    (outdir / f"{stem}.json").write_text(json.dumps(dict(
        settings=dict(vars(args), init=INIT, jitter=JITTER, wall_seconds=wall, cpu_affinity=str(affinity),
                      versions=dict(vijax=vj.__version__, gpjax=gpx.__version__, jax=jax.__version__,
                                    optax=optax.__version__)),
        checks=check_results, records=records), indent=1))
    try:
        plot(records, outdir / f"{stem}.png", args.tasks, args.M)
    except Exception as exc:
        print(f"plot failed: {exc}")


if __name__ == "__main__":
    main()
