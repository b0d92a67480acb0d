"""Latent Gaussian factor models: Khan's thesis experiments 4, 5 and 10, and variational EM at scale.

A benchmark script, not a test. One experiment per subcommand; each prints its table and saves it as
``benchmarks/results/factor_<experiment>.txt``.

- ``lggm_binary`` — experiment 4 (§4.7, Fig. 4.5): parameter estimation in a 5-D binary latent Gaussian
  graphical model, Böhning and Jaakkola against piecewise bounds. The true model has μ* = 0 and a Σ* whose
  dimensions 1–3 are strongly positively and 4–5 strongly negatively correlated (the thesis shows Σ* only in a
  figure: here variances 4 and correlations ±0.9, the blocks independent). The "data" are the 32 binary
  patterns, each one row weighted by 20,000 × p(y | θ*) (estimated from 2·10⁶ samples;
  `vj.factor.observe(model, Y, weights=...)`). Each bound fits μ, Σ by variational EM
  (`vj.factor.graphical_model`) to a relative change of 1e-10 or 20,000 iterations; the score is
  KL(p(y | θ*) ‖ p(y | θ̂)) over the 32 patterns, p(y | θ̂) from 2·10⁶ samples of N(μ̂, Σ̂). The thesis
  reports only a figure: piecewise bounds with enough pieces have far lower KL than B and J, which shrink
  the covariance.
- ``voting`` — experiment 5 (§4.7, Figs. 4.6–4.9): binary factor analysis of the UCI Congressional Voting
  Records, imputation error of the Böhning, Jaakkola and piecewise bounds. Data:
  ``../shared/data/uci/house-votes-84.data`` (435 members × party + 16 votes). The thesis removes 3 weakly
  correlated issues and the rows with missing votes, leaving N = 258, D = 14 (13 issues + party), without
  naming the issues: here the 3 issues with the smallest mean absolute correlation with the others (over the
  complete pairs) are removed, then every row with a missing vote. Protocol (thesis): 3-factor binary FA;
  80/20 row split; for every test row one dimension, chosen at random, is held out; q(z_n) is fitted on the
  row's other entries under the trained model and the held-out value scored by its predictive cross-entropy
  −log p(y | observed) (Gauss–Hermite). Reported: the mean cross-entropy per bound and split, and on how
  many of the ``--splits`` splits Q20 beats B and J (the thesis: all 10).
- ``categorical`` — experiment 10 (§5.7, Figs. 5.3–5.5): a 2-D categorical latent Gaussian graphical model,
  multinomial-logit bounds (Böhning, log) against the stick-breaking likelihood with piecewise bounds.
  Truth: two categorical dimensions with C = K + 1 categories each, category 0's predictor fixed at 0, K
  latents per dimension (W = I, w₀ = 0, μ* = 0), Σ*_ii = 20 var(X_:i) + 1 and Σ*_ij = 20 cov(X_:i, X_:j)
  with X = [I_K I_K] (thesis eq. 5.38, population moments over X's K rows), so both dimensions tend to take
  the same category; data from the multinomial-logit model. The thesis draws 10⁶ data vectors; here each of
  the C² possible vectors is one row with weight 10⁶ × its probability (from 10⁶ samples of the truth), i.e.
  the expected counts. Each method fits μ, Σ by variational EM and is scored by
  KL(p_logit(y | θ*) ‖ p(y | θ̂)) over the C² vectors, p(y | θ̂) under the method's own likelihood (logit
  for Böhning and log, stick for stick-PW) from 10⁶ samples of N(μ̂, Σ̂). Thesis (figure only): stick-PW has
  consistently very low KL for 4–8 categories, the logit bounds do not. About 7 minutes.
- ``scale`` — variational EM for a binary factor model at N = 100,000, D = 50, L = 10 (target: under 10 s
  per EM iteration on a 2-core CPU). For each bound (Böhning with the shared-covariance E-step, Jaakkola,
  20-piece quadratic piecewise) it runs EM on synthetic data from a random binary factor model and reports
  the time of each EM iteration after the first (which includes compilation), the E-step iterations, the
  bound, and the process's peak resident memory. Saved as ``factor_scale[_float32][_estep<k>].txt``.

Run::

    python benchmarks/factor.py lggm_binary
    python benchmarks/factor.py voting [--splits 10]
    python benchmarks/factor.py categorical [--categories 4,5,6,7,8]
    python benchmarks/factor.py scale [--n 100000] [--iters 4] [--dtype float32] [--e-step-iters 2]
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import resource

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

from _common import Tee, timed  # noqa: E402

F = vj.factor


# ----------------------------------------------------------------------------------- experiment 4
PATTERNS = np.array(list(itertools.product([0, 1], repeat=5)), float)


def pattern_probabilities(mean, cov, num=2_000_000, seed=0):
    z = np.random.default_rng(seed).multivariate_normal(mean, cov, size=num)
    p1 = 1 / (1 + np.exp(-z))  # (num, 5)
    probs = np.array([np.mean(np.prod(np.where(y > 0, p1, 1 - p1), 1)) for y in PATTERNS])
    return probs / probs.sum()


def lggm_binary(args):
    corr = np.eye(5)
    corr[:3, :3] = 0.9
    corr[3:, 3:] = -0.9
    np.fill_diagonal(corr, 1.0)
    p_true = pattern_probabilities(np.zeros(5), 4.0 * corr)
    weights = 20_000 * p_true
    bounds = [("Bohning", F.Bernoulli("bohning")), ("Jaakkola", F.Bernoulli("jaakkola"))]
    bounds += [(f"L{r}", F.Bernoulli("piecewise", r, "linear")) for r in (3, 5, 10)]
    bounds += [(f"Q{r}", F.Bernoulli("piecewise", r, "quadratic")) for r in (3, 5, 10, 20)]
    log = Tee()
    log("5-D binary LGGM (thesis experiment 4): the 32 patterns weighted by 20,000 × their true probabilities",
        f"{'bound':<9} {'KL(true||fit)':>14} {'EM its':>7} {'time s':>7}  {'fitted variances':<34} fitted corr(1,2), corr(4,5)")
    for name, lik in bounds:
        data = F.observe(F.graphical_model(lik, num_columns=5), PATTERNS, weights=weights)
        result, (elapsed,) = timed(lambda: vj.infer(data, F.EM(max_iter=20_000, tol=1e-10)))
        m, s = np.asarray(result.fitted.mean), np.asarray(result.fitted.cov)
        p_fit = pattern_probabilities(m, s)
        kl = float(np.sum(p_true * (np.log(p_true) - np.log(p_fit))))
        sd = np.sqrt(np.diag(s))
        corr = s / np.outer(sd, sd)
        log(f"{name:<9} {kl:>14.5f} {int(result.diagnostics.iterations):>7d} {elapsed:>7.1f}  "
            f"{np.array2string(np.diag(s), precision=2):<34} {corr[0, 1]:.3f}, {corr[3, 4]:.3f}")
    log("true variances 4.0, correlations 0.9 (dims 1–3) and −0.9 (dims 4–5)")
    log.save("factor_lggm_binary")


# ----------------------------------------------------------------------------------- experiment 5
VOTES = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "uci" / "house-votes-84.data"
BOUNDS = {"B": ("bohning", 20, "quadratic"), "J": ("jaakkola", 20, "quadratic"), "L3": ("piecewise", 3, "linear"),
          "Q3": ("piecewise", 3, "quadratic"), "Q10": ("piecewise", 10, "quadratic"), "Q20": ("piecewise", 20, "quadratic")}


def load_votes():
    if not VOTES.exists():
        raise SystemExit(f"{VOTES} not found: this benchmark needs the shared UCI data.")
    rows = [line.strip().split(",") for line in VOTES.read_text().splitlines() if line.strip()]
    code = {"y": 1.0, "n": 0.0, "?": np.nan, "republican": 1.0, "democrat": 0.0}
    X = np.array([[code[v] for v in r] for r in rows])  # column 0: party
    corr = np.ma.corrcoef(np.ma.masked_invalid(X[:, 1:]).T).filled(0.0)
    np.fill_diagonal(corr, 0.0)
    weakest = np.argsort(np.abs(corr).mean(0))[:3]
    X = X[:, [0] + [1 + j for j in range(16) if j not in weakest]]
    return X[np.all(np.isfinite(X), 1)], sorted(int(j) + 1 for j in weakest)


def held_out_cross_entropy(bound, Y_train, Y_test, test_mask, latent_dim, seed):
    model = F.factor_analysis(F.Bernoulli(*BOUNDS[bound]), latent_dim, jax.random.PRNGKey(seed),
                              num_columns=Y_train.shape[1])
    fit = vj.infer(F.observe(model, Y_train), F.EM(max_iter=300, tol=1e-7))
    test = vj.infer(F.observe(fit.fitted, Y_test, test_mask), F.EStep())
    lp = np.asarray(F.log_predictive(test, Y_test, key=jax.random.PRNGKey(0)))
    return -float(lp[~test_mask].mean()), int(fit.diagnostics.iterations)


def voting(args):
    X, removed = load_votes()
    n, d = X.shape
    bounds = args.bounds.split(",")
    log = Tee()
    log(f"Voting records: N = {n}, D = {d} (party + {d - 1} issues; removed issues {removed}); "
        f"{args.latent}-factor binary FA; 80/20 splits; mean held-out cross-entropy (nats), EM iterations",
        "split  " + "  ".join(f"{b:>14}" for b in bounds))
    table = {b: [] for b in bounds}
    for split in range(args.splits):
        rng = np.random.default_rng(split)
        perm = rng.permutation(n)
        train, test = X[perm[: int(0.8 * n)]], X[perm[int(0.8 * n):]]
        mask = np.ones(test.shape, bool)  # one dimension of each test row, chosen at random, held out
        mask[np.arange(len(test)), rng.integers(0, d, len(test))] = False
        row = []
        for b in bounds:
            ce, its = held_out_cross_entropy(b, train, test, mask, args.latent, split)
            table[b].append(ce)
            row.append(f"{ce:>9.4f} ({its:>3d})")
        log(f"{split:>5}  " + "  ".join(row))
    log("mean   " + "  ".join(f"{np.mean(table[b]):>14.4f}" for b in bounds))
    for other in ("B", "J") if "Q20" in table else ():
        if other in table:
            wins = int(np.sum(np.array(table["Q20"]) < np.array(table[other])))
            log(f"Q20 below {other} on {wins}/{args.splits} splits (thesis: 10/10)")
    log.save("factor_voting")


# ---------------------------------------------------------------------------------- experiment 10
def vector_probabilities(lik, mean, cov, c, num=1_000_000, seed=0, chunk=100_000):
    """p(y | μ, Σ) for all C² vectors y, by Monte Carlo over z ~ N(μ, Σ), under ``lik`` per dimension."""
    rng = np.random.default_rng(seed)
    k = c - 1
    total = np.zeros((c, c))
    for _ in range(0, num, chunk):
        z = jnp.asarray(rng.multivariate_normal(mean, cov, size=chunk))
        per_dim = [np.stack([np.exp(np.asarray(lik.log_prob(jnp.full(chunk, float(y)), z[:, d * k:(d + 1) * k])))
                             for y in range(c)], 1) for d in range(2)]  # (chunk, C) each
        total += np.einsum("na,nb->ab", per_dim[0], per_dim[1])
    return total / num


def categorical(args):
    log = Tee()
    log("2-D categorical LGGM (thesis experiment 10): KL(true logit model || fitted model) over all vectors",
        f"(C² rows weighted by 10⁶ × their true probabilities; EM to relative change 1e-9 or {args.iters} iterations)",
        f"{'C':>3} {'logit-Bohning':>14} {'logit-log':>10} {'stick-PW (Q20)':>15}   EM iterations / time (s)")
    for c in (int(x) for x in args.categories.split(",")):
        k = c - 1
        X = np.concatenate([np.eye(k), np.eye(k)], 1)
        cov = 20 * np.cov(X.T, bias=True) + np.eye(2 * k)
        truth = vector_probabilities(F.Multinomial(c), np.zeros(2 * k), cov, c)
        Y = np.array(list(itertools.product(range(c), repeat=2)), float)
        kls, info = [], []
        for lik in (F.Multinomial(c, "bohning"), F.Multinomial(c, "log"), F.StickBreaking(c)):
            data = F.observe(F.graphical_model(lik, num_columns=2), Y, weights=1e6 * truth.ravel())
            fit, (elapsed,) = timed(lambda: vj.infer(data, F.EM(max_iter=args.iters, tol=1e-9)))
            fitted = vector_probabilities(lik, np.asarray(fit.fitted.mean), np.asarray(fit.fitted.cov), c, seed=1)
            kls.append(float(np.sum(truth * (np.log(truth) - np.log(fitted)))))
            info.append(f"{int(fit.diagnostics.iterations)}/{elapsed:.0f}")
        log(f"{c:>3} {kls[0]:>14.4f} {kls[1]:>10.4f} {kls[2]:>15.4f}   " + ", ".join(info))
    log.save("factor_categorical")


# ------------------------------------------------------------------------------------------ scale
def scale(args):
    dtype = jnp.dtype(args.dtype)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(args.d, args.l)) / np.sqrt(args.l) * 2.0
    eta = rng.normal(size=(args.n, args.l)) @ w.T + rng.normal(size=args.d) * 0.5
    Y = jnp.asarray(rng.uniform(size=(args.n, args.d)) < 1 / (1 + np.exp(-eta)), dtype)
    mask = jnp.ones(Y.shape, bool)
    log = Tee()
    log(f"binary factor analysis, N = {args.n}, D = {args.d}, L = {args.l}, {args.dtype}, "
        f"at most {args.e_step_iters} E-step iterations, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s); target < 10 s per EM iteration",
        f"{'bound':<10} {'first (compile) s':>18} {'later iterations s':>22} {'E-step its':>11} {'bound after E-step':>22}")
    for bound in args.bounds.split(","):
        model = F.factor_analysis(F.Bernoulli(bound), args.l, jax.random.PRNGKey(0), num_columns=args.d, dtype=dtype)
        q = F.initial_posteriors(model, args.n)
        times, e_its, bounds = [], [], []

        def em_iteration(model, q):
            q = F.e_step(model, Y, mask, q, args.e_step_iters, complete=True)
            bounds.append(float(jnp.sum(q.bound)))
            return F.m_step(model, Y, mask, q), q

        for _ in range(args.iters):
            (model, q), seconds = timed(em_iteration, model, q)
            times += seconds
            e_its.append(int(jnp.max(q.iterations)))
        later = " ".join(f"{t:.2f}" for t in times[1:])
        log(f"{bound:<10} {times[0]:>18.2f} {later:>22} {max(e_its[1:] or e_its):>11d} {bounds[-1]:>22.2f}")
    log(f"peak resident memory of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    log.save("factor_scale" + ("" if args.dtype == "float64" else "_" + args.dtype)
             + ("" if args.e_step_iters == 100 else f"_estep{args.e_step_iters}"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="experiment", required=True)
    sub.add_parser("lggm_binary", help="experiment 4: 5-D binary LGGM, KL per bound").set_defaults(run=lggm_binary)
    p = sub.add_parser("voting", help="experiment 5: voting records, held-out cross-entropy per bound")
    p.add_argument("--splits", type=int, default=10)
    p.add_argument("--latent", type=int, default=3)
    p.add_argument("--bounds", default="B,J,L3,Q3,Q10,Q20")
    p.set_defaults(run=voting)
    p = sub.add_parser("categorical", help="experiment 10: 2-D categorical LGGM, logit bounds against stick-breaking")
    p.add_argument("--categories", default="4,5,6,7,8")
    p.add_argument("--iters", type=int, default=3000, help="EM iterations at most (relative tol 1e-9)")
    p.set_defaults(run=categorical)
    p = sub.add_parser("scale", help="binary factor EM at N = 100,000: time per iteration and memory")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--d", type=int, default=50)
    p.add_argument("--l", type=int, default=10)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--bounds", default="bohning,jaakkola,piecewise")
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--e-step-iters", type=int, default=100,
                   help="natural-gradient steps per point per E-step (fewer: partial E-steps, still monotone)")
    p.set_defaults(run=scale)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
