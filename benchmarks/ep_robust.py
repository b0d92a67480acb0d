"""Robustness of expectation propagation (`vj.EP`) on GP regression with heavy-tailed likelihoods.

A benchmark script, not a test. GP regression with N = 100 latent function values f and a
non-Gaussian likelihood on every f_n is the classic setting where plain parallel EP oscillates or
diverges (the Student-t likelihood is not log-concave; Jylänki, Vanhatalo & Vehtari 2011). The GP
is built by hand: with inputs X (N × d), an SE-ARD kernel

    K = s² exp(−½ Σ_j (x_ij − x_kj)² / ℓ_j²) + 1e-6 I,
    model = vj.LatentLinearModel(vj.GaussianFactor.dense(0, K), vj.Sites(vj.Identity(N), likelihood)),

with likelihood ``vj.potentials.StudentT(df=3, loc=y, scale=σ)`` or ``vj.potentials.Laplace(loc=y,
scale=b)``. Synthetic data sets (a fresh draw for every seed):

- ``neal`` (Neal 1997, §7): x ~ N(0, 1), f(x) = 0.3 + 0.4x + 0.5 sin(2.7x) + 1.1/(1 + x²),
  y = f + ε with ε ~ N(0, 0.1²) with probability 0.95 and N(0, 1) with probability 0.05.
  Hyperparameters ℓ = 1, s² = 1, σ = b = 0.1.
- ``friedman`` (Friedman 1991, #1, with outliers): x ~ U[0, 1]^10, f = 10 sin(π x1 x2) +
  20 (x3 − 0.5)² + 10 x4 + 5 x5, y = f + N(0, 1), then 10% of the targets (chosen at random) are
  replaced by f + N(0, 15²); y is standardised (mean 0, s.d. 1). Hyperparameters ℓ_j = 1 for all
  ten dimensions (the inputs span [0, 1], so the function varies on the scale of the data without
  being a near-constant), s² = 1, σ = b = 0.1 on the standardised targets.

Variants of EP, each run on every (data set, likelihood, seed):

- ``plain``: vj.EP(damping=1.0, fallback=False) (undamped parallel EP);
- ``damped``: vj.EP(damping=0.5, fallback=False);
- ``power 0.5`` / ``power 0.9``: vj.EP(power=η, fallback=False) (power EP, default adaptive damping);
- ``double loop``: vj.EP(schedule="double_loop", max_iter=100) (the convergent min–max scheme);
- ``default``: vj.EP() (parallel with adaptive damping: δ = 1, halved whenever the moment-matching
  residual rises; from the Laplace sites; a run that stalls continues with sequential sweeps, then the
  double loop).

References, computed in the same run for every (data set, likelihood, seed):

- the G-KL lower bound on log Z, ``vj.infer(model, vj.GKL()).log_z``;
- an importance-sampling estimate log Z_IS with a multivariate Student-t proposal (df = 5) with the
  mean and covariance of the default EP fit: with S draws f_s ~ q,
  log Z_IS = logsumexp_s(log p(y, f_s) − log q(f_s)) − log S. Its standard error is the delta-method
  s.e. of the log of the mean weight, sd(w)/(√S · mean(w)), and ESS = (Σ w)² / Σ w².

Per (data set, likelihood, variant) the table gives: converged runs / runs (``diagnostics.converged``);
the number of those where a fallback schedule took over; median iterations; median fit
time in seconds (an ahead-of-time compiled ``jax.jit(vj.infer)``, compiled once per likelihood and
variant, so compilation is excluded; ``jax.block_until_ready``); and the mean ± standard error
over seeds of log Z_EP − log Z_IS and of log Z_EP − (G-KL bound); the number of runs whose log Z_EP is
below the G-KL bound, and whose |log Z_EP − log Z_IS| exceeds 3 IS standard errors. Non-finite log Z
values are excluded from the means and counted in the ``nan`` column. Each block's header gives the
mean G-KL bound and the mean ESS and IS standard error over seeds. Columns ``fb`` and ``stl`` count
``diagnostics.info.fallback`` and ``diagnostics.status == vj.Status.STALLED``.

Run (float64 is switched on by this script)::

    python benchmarks/ep_robust.py            # 20 seeds, S = 20,000 IS draws
    python benchmarks/ep_robust.py --quick    # 4 seeds, S = 4,000

Options: ``--seeds K`` overrides the number of seeds, ``--double-loop-seeds K`` runs the double-loop
variant on the first K seeds only (default: all seeds with --quick, 2 otherwise: a double-loop fit takes 20–80 s here).
Writes ``benchmarks/results/ep_robust[_quick].json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import platform
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, logsumexp

import vijax as vj

import _data
from _common import RESULTS, mean_se, timed

N = 100
JITTER = 1e-6
IS_DF = 5.0


# ------------------------------------------------------------------------------------------ data
def neal_data(rng):
    x, y = _data.neal_data(rng, N)
    return x, y, dict(lengthscale=np.ones(1), variance=1.0, scale=0.1)


def friedman_data(rng):
    x, y = _data.friedman_data(rng, N, standardise=True)
    return x, y, dict(lengthscale=np.ones(10), variance=1.0, scale=0.1)


DATA = {"neal": neal_data, "friedman": friedman_data}
LIKELIHOODS = ("student-t", "laplace")


def se_ard(x, lengthscale, variance):
    z = x / lengthscale
    sq = np.sum(z**2, 1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * z @ z.T, 0.0)
    return variance * np.exp(-0.5 * d2) + JITTER * np.eye(len(x))


def build_model(data, likelihood, seed):
    rng = np.random.default_rng([seed, list(DATA).index(data)])
    x, y, hyp = DATA[data](rng)
    K = se_ard(x, hyp["lengthscale"], hyp["variance"])
    if likelihood == "student-t":
        lik = vj.potentials.StudentT(df=3.0, loc=y, scale=hyp["scale"])
    else:
        lik = vj.potentials.Laplace(loc=y, scale=hyp["scale"])
    return vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(N), K), vj.Sites(vj.Identity(N), lik))


# -------------------------------------------------------------------------------------- methods
VARIANTS = {
    "plain": vj.EP(damping=1.0, fallback=False),
    "damped": vj.EP(damping=0.5, fallback=False),
    "power 0.5": vj.EP(power=0.5, fallback=False),
    "power 0.9": vj.EP(power=0.9, fallback=False),
    "double loop": vj.EP(schedule="double_loop", max_iter=100),
    "default": vj.EP(),
}


_COMPILED = {}


def timed_fit(model, name, method):
    """Fit with an ahead-of-time compiled `vj.infer` (compiled once per likelihood type and variant,
    so the time excludes compilation); returns (posterior, seconds)."""
    key = (type(model.sites[0].potential).__name__, name)
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(lambda m: vj.infer(m, method)).lower(model).compile()
    post, (seconds,) = timed(_COMPILED[key], model)
    return post, seconds


# ----------------------------------------------------------------------------- importance sampling
def importance_sampling(model, mean, cov, num_samples, key, batch=4000):
    """log Z_IS with a multivariate-t(df=5) proposal at (mean, cov); returns (log Z, s.e., ESS)."""
    mean, cov = jnp.asarray(mean), jnp.asarray(cov)
    dim = mean.shape[0]
    L = jnp.linalg.cholesky(cov + 1e-10 * jnp.trace(cov) / dim * jnp.eye(dim))
    log_det = 2 * jnp.sum(jnp.log(jnp.diag(L)))
    nu = IS_DF
    log_norm = gammaln((nu + dim) / 2) - gammaln(nu / 2) - 0.5 * dim * jnp.log(nu * jnp.pi) - 0.5 * log_det
    log_joint = jax.jit(jax.vmap(model.log_joint))

    @jax.jit
    def draw(key):
        k1, k2 = jax.random.split(key)
        z = jax.random.normal(k1, (batch, dim), mean.dtype)
        g = jax.random.chisquare(k2, nu, (batch,), mean.dtype)
        u = z / jnp.sqrt(g / nu)[:, None]
        f = mean + u @ L.T
        log_q = log_norm - 0.5 * (nu + dim) * jnp.log1p(jnp.sum(u**2, 1) / nu)
        return f, log_q

    log_w = []
    for k in jax.random.split(key, math.ceil(num_samples / batch)):
        f, log_q = draw(k)
        log_w.append(log_joint(f) - log_q)
    log_w = np.asarray(jnp.concatenate(log_w)[:num_samples])
    # A draw where the target is 0 has weight 0 (log w = −inf, kept); NaN or +inf would be a bug.
    if np.any(np.isnan(log_w) | (log_w == np.inf)):
        raise RuntimeError("importance sampling: NaN or +inf log weights")
    S = len(log_w)
    log_z = float(logsumexp(log_w) - math.log(S))
    w = np.exp(log_w - log_w.max())
    se = float(np.std(w, ddof=1) / (math.sqrt(S) * np.mean(w)))
    ess = float(w.sum() ** 2 / np.sum(w**2))
    return log_z, se, ess


# ---------------------------------------------------------------------------------------- running
def finite(v):
    return v is not None and math.isfinite(v)


def run_case(data, likelihood, seeds, dl_seeds, num_is, log):
    """Every variant and the references on `seeds` draws of one (data set, likelihood)."""
    runs = []
    for seed in range(seeds):
        model = build_model(data, likelihood, seed)
        gkl, _ = timed_fit(model, "G-KL", vj.GKL())
        rec = dict(data=data, likelihood=likelihood, seed=seed, gkl=float(gkl.log_z),
                   gkl_converged=bool(gkl.diagnostics.converged), variants={})
        for name, method in VARIANTS.items():
            if name == "double loop" and seed >= dl_seeds:
                continue
            post, seconds = timed_fit(model, name, method)
            d = post.diagnostics
            rec["variants"][name] = dict(
                log_z=float(post.log_z), converged=bool(d.converged), iterations=int(d.iterations),
                seconds=seconds, fallback=bool(d.info.fallback), stalled=int(d.status) == vj.Status.STALLED,
                skipped=int(d.info.skipped), shrunk=int(d.info.shrunk), max_change=float(d.info.max_change),
                num_value_evals=int(d.num_value_evals))
            if name == "default":
                default_post = post
        m, S = np.asarray(default_post.mean), np.asarray(default_post.covariance)
        if np.all(np.isfinite(m)) and np.all(np.isfinite(S)):
            key = jax.random.key(1000 * seed + 7 * list(DATA).index(data) + LIKELIHOODS.index(likelihood))
            rec["is_log_z"], rec["is_se"], rec["is_ess"] = importance_sampling(model, m, S, num_is, key)
        else:
            rec["is_log_z"] = rec["is_se"] = rec["is_ess"] = None
        v = rec["variants"]
        log(f"  {data:<8} {likelihood:<9} seed {seed:>2}: G-KL {rec['gkl']:9.3f}  IS "
            f"{rec['is_log_z'] if rec['is_log_z'] is None else round(rec['is_log_z'], 3)} "
            f"(se {rec['is_se'] or float('nan'):.3f}, ESS {rec['is_ess'] or float('nan'):.0f})  "
            + "  ".join(f"{n}: {r['log_z']:.3f}{'' if r['converged'] else '*'}" for n, r in v.items()))
        runs.append(rec)
    return runs


def summarise(runs):
    rows = []
    for name in VARIANTS:
        rs = [(r, r["variants"][name]) for r in runs if name in r["variants"]]
        if not rs:
            continue
        is_diff = [v["log_z"] - r["is_log_z"] for r, v in rs if finite(r["is_log_z"]) and finite(v["log_z"])]
        gkl_diff = [v["log_z"] - r["gkl"] for r, v in rs if finite(v["log_z"])]
        rows.append(dict(
            variant=name, runs=len(rs), converged=sum(v["converged"] for _, v in rs),
            fallback=sum(v["fallback"] for _, v in rs), stalled=sum(v["stalled"] for _, v in rs),
            nonfinite=sum(not finite(v["log_z"]) for _, v in rs),
            median_iterations=float(np.median([v["iterations"] for _, v in rs])),
            median_seconds=float(np.median([v["seconds"] for _, v in rs])),
            minus_is=mean_se(is_diff, count=True), minus_gkl=mean_se(gkl_diff, count=True),
            below_gkl=sum(d < -1e-6 for d in gkl_diff),
            beyond_is_3se=sum(abs(v["log_z"] - r["is_log_z"]) > 3 * r["is_se"] + 1e-3 for r, v in rs
                              if finite(r["is_log_z"]) and finite(v["log_z"]))))
    return rows


def format_table(case_rows, runs, dl_seeds, seeds):
    out = io.StringIO()
    header = (f"  {'variant':<12} {'conv':>7} {'fb':>3} {'stl':>3} {'nan':>3} {'iters':>6} {'time s':>7} "
              f"{'logZ_EP − logZ_IS':>19} {'logZ_EP − G-KL':>17} {'<GKL':>4} {'>3se':>4}")
    for (data, likelihood), rows in case_rows.items():
        rs = [r for r in runs if r["data"] == data and r["likelihood"] == likelihood]
        ess = mean_se([r["is_ess"] for r in rs])[0]
        is_se = mean_se([r["is_se"] for r in rs])[0]
        gkl = mean_se([r["gkl"] for r in rs])[0]
        print(f"\n{data}, {likelihood} (N = {N}; {len(rs)} seeds; G-KL bound mean {gkl:.3f}; "
              f"IS: mean ESS {ess:.0f}, mean s.e. {is_se:.3f})", file=out)
        print(header + "\n  " + "-" * (len(header) - 2), file=out)
        for r in rows:
            name = r["variant"] + ("†" if r["variant"] == "double loop" and dl_seeds < seeds else "")
            a, b = r["minus_is"], r["minus_gkl"]
            print(f"  {name:<12} {r['converged']:>3}/{r['runs']:<3} {r['fallback']:>3} {r['stalled']:>3} "
                  f"{r['nonfinite']:>3} {r['median_iterations']:>6.0f} {r['median_seconds']:>7.3f} "
                  f"{a[0]:>9.4f} ± {a[1]:<7.4f} {b[0]:>8.4f} ± {b[1]:<6.4f} {r['below_gkl']:>4} "
                  f"{r['beyond_is_3se']:>4}", file=out)
    print("\nconv: converged runs / runs; fb: fallback schedule used; stl: the last schedule's residual stopped improving; "
          "nan: non-finite log Z\n(excluded from the means); iters, time: medians (compilation "
          "excluded); differences: mean ± s.e. over seeds;\n<GKL: runs with log Z_EP below the G-KL bound; "
          ">3se: runs with |log Z_EP − log Z_IS| > 3 IS s.e. + 0.001.", file=out)
    if dl_seeds < seeds:
        print(f"† double loop run on the first {dl_seeds} seeds only (time budget).", file=out)
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 seeds, 4,000 IS draws")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--double-loop-seeds", type=int, default=None)
    parser.add_argument("--is-samples", type=int, default=None)
    parser.add_argument("--data", nargs="+", choices=sorted(DATA), default=list(DATA))
    args = parser.parse_args()
    seeds = args.seeds or (4 if args.quick else 20)
    dl_seeds = min(seeds, args.double_loop_seeds if args.double_loop_seeds is not None else (seeds if args.quick else 2))
    num_is = args.is_samples or (4000 if args.quick else 20000)
    start = time.perf_counter()
    print(f"vijax {vj.__version__}, jax {jax.__version__}, {platform.processor() or platform.machine()}; "
          f"{seeds} seeds (double loop: {dl_seeds}), IS: {num_is} draws, t(df={IS_DF:g}) proposal")
    runs, case_rows = [], {}
    for data in args.data:
        for likelihood in LIKELIHOODS:
            rs = run_case(data, likelihood, seeds, dl_seeds, num_is, lambda s: print(s, flush=True))
            runs += rs
            case_rows[(data, likelihood)] = summarise(rs)
    table = format_table(case_rows, runs, dl_seeds, seeds)
    wall = time.perf_counter() - start
    table += f"wall time {wall:.0f} s\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    stem = f"ep_robust{'_quick' if args.quick else ''}"
    (RESULTS / f"{stem}.txt").write_text(" ".join(sys.argv) + "\n" + table)
    summary = [dict(data=d, likelihood=l, **r) for (d, l), rows in case_rows.items() for r in rows]
    (RESULTS / f"{stem}.json").write_text(json.dumps(dict(
        settings=dict(seeds=seeds, double_loop_seeds=dl_seeds, is_samples=num_is, is_df=IS_DF, N=N,
                      jitter=JITTER, wall_seconds=wall),
        summary=summary, runs=runs), indent=1))


if __name__ == "__main__":
    main()
