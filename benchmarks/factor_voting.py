"""Khan thesis experiment 5 (§4.7, Figs. 4.6–4.9): binary factor analysis of the UCI Congressional
Voting Records, imputation error of the Böhning, Jaakkola and piecewise bounds.

Data: ``../shared/data/uci/house-votes-84.data`` (435 members × party + 16 votes). The thesis removes
3 weakly correlated issues and the rows with missing votes, leaving N = 258, D = 14 (13 issues + party),
without naming the issues: here the 3 issues with the smallest mean absolute correlation with the
others (over the complete pairs) are removed, then every row with a missing vote.

Protocol (thesis): 3-factor binary FA; 80/20 row split; for every test row one dimension, chosen at
random, is held out; q(z_n) is fitted on the row's other entries under the trained model and the
held-out value scored by its predictive cross-entropy −log p(y | observed) (Gauss–Hermite). Reported:
the mean cross-entropy per bound and split, and on how many of the 10 splits Q20 beats B and J (the
thesis: all 10). Run: ``python benchmarks/factor_voting.py [--splits 10]``; results in
``benchmarks/results/factor_voting.txt``.
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

from _common import Tee, timed  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "uci" / "house-votes-84.data"
BOUNDS = {"B": ("bohning", 20, "quadratic"), "J": ("jaakkola", 20, "quadratic"), "L3": ("piecewise", 3, "linear"),
          "Q3": ("piecewise", 3, "quadratic"), "Q10": ("piecewise", 10, "quadratic"), "Q20": ("piecewise", 20, "quadratic")}


def load():
    if not DATA.exists():
        raise SystemExit(f"{DATA} not found: this benchmark needs the shared UCI data.")
    rows = [line.strip().split(",") for line in DATA.read_text().splitlines() if line.strip()]
    code = {"y": 1.0, "n": 0.0, "?": np.nan, "republican": 1.0, "democrat": 0.0}
    X = np.array([[code[v] for v in r] for r in rows])  # column 0: party
    votes = X[:, 1:]
    corr = np.ma.corrcoef(np.ma.masked_invalid(votes).T).filled(0.0)
    np.fill_diagonal(corr, 0.0)
    weakest = np.argsort(np.abs(corr).mean(0))[:3]
    keep = [0] + [1 + j for j in range(16) if j not in weakest]
    X = X[:, keep]
    X = X[np.all(np.isfinite(X), 1)]
    return X, sorted(int(j) + 1 for j in weakest)


def held_out_mask(n, d, rng):
    mask = np.ones((n, d), bool)
    mask[np.arange(n), rng.integers(0, d, n)] = False
    return mask


def score(bound, Y_train, Y_test, test_mask, latent_dim, seed):
    lik = vj.factor.Bernoulli(*BOUNDS[bound])
    model = vj.factor.factor_analysis(lik, latent_dim, jax.random.PRNGKey(seed), num_columns=Y_train.shape[1])
    fit, (elapsed,) = timed(lambda: vj.infer(vj.factor.observe(model, Y_train), vj.factor.EM(max_iter=300, tol=1e-7)))
    test = vj.infer(vj.factor.observe(fit.fitted, Y_test, test_mask), vj.factor.EStep())
    lp = np.asarray(vj.factor.log_predictive(test, Y_test, key=jax.random.PRNGKey(0)))
    return -float(lp[~test_mask].mean()), int(fit.diagnostics.iterations), elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--latent", type=int, default=3)
    parser.add_argument("--bounds", default="B,J,L3,Q3,Q10,Q20")
    args = parser.parse_args()
    X, removed = load()
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
        mask = held_out_mask(len(test), d, rng)
        row = []
        for b in bounds:
            ce, its, _ = score(b, train, test, mask, args.latent, split)
            table[b].append(ce)
            row.append(f"{ce:>9.4f} ({its:>3d})")
        log(f"{split:>5}  " + "  ".join(row))
    log("mean   " + "  ".join(f"{np.mean(table[b]):>14.4f}" for b in bounds))
    if "Q20" in table:
        for other in ("B", "J"):
            if other in table:
                wins = int(np.sum(np.array(table["Q20"]) < np.array(table[other])))
                log(f"Q20 below {other} on {wins}/{args.splits} splits (thesis: 10/10)")
    log.save("factor_voting")


if __name__ == "__main__":
    main()
