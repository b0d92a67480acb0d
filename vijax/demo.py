"""Bayesian logistic regression on the breast-cancer data with every vijax method.

Run ``python -m vijax.demo [--output vijax_demo.png] [--seed 0]``. The data are
scikit-learn's bundled copy (569 tumours, 30 features), standardised with the
training-set statistics and given an intercept column; the prior is N(0, I).
Each method is compiled once, then timed on a second call.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

METHODS = [
    # (name, method factory) — one line per method; later methods are added here.
    ("G-KL full, Newton-CG", lambda vj: vj.GKL(solver=vj.solvers.NewtonCG())),
    ("G-KL full, Newton", lambda vj: vj.GKL(solver=vj.solvers.Newton())),
    ("G-KL full, L-BFGS", lambda vj: vj.GKL(solver=vj.solvers.LBFGS())),
    ("G-KL diagonal, Newton-CG", lambda vj: vj.GKL(covariance=vj.covariance.Diagonal())),
]


def load_data(seed: int):
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    n_train = int(0.7 * len(y))
    train, test = order[:n_train], order[n_train:]
    mu, sd = X[train].mean(0), X[train].std(0)
    Z = np.hstack([(X - mu) / sd, np.ones((len(y), 1))])
    return Z[train], y[train], Z[test], y[test]


def fit_all(X, y, X_test, y_test):
    import vijax as vj

    model = vj.glm.logistic_regression(X, y, prior_variance=1.0)
    rows = []
    for name, make in METHODS:
        fit = jax.jit(lambda m, method=make(vj): vj.infer(m, method))
        jax.block_until_ready(fit(model))
        start = time.perf_counter()
        post = jax.block_until_ready(fit(model))
        seconds = time.perf_counter() - start
        p = np.asarray(vj.glm.predict_proba(post, X_test))
        rows.append(dict(
            name=name, post=post, seconds=seconds,
            log_z=float(post.log_z), bound=post.is_lower_bound,
            test_ll=float(np.mean(vj.glm.log_predictive(post, X_test, y_test))),
            accuracy=float(np.mean((p > 0.5) == (y_test > 0.5))),
            iterations=int(post.diagnostics.iterations), converged=bool(post.diagnostics.converged),
        ))
    return rows


def print_table(rows):
    header = f"{'method':<26} {'log Z':>10} {'bound?':>7} {'test LL/pt':>11} {'accuracy':>9} {'iters':>6} {'conv':>5} {'time (s)':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['name']:<26} {r['log_z']:>10.3f} {('yes' if r['bound'] else 'no'):>7} {r['test_ll']:>11.4f} "
              f"{r['accuracy']:>9.3f} {r['iterations']:>6d} {str(r['converged']):>5} {r['seconds']:>9.4f}")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for r, offset in zip((rows[0], rows[-1]), (-0.15, 0.15)):
        post = r["post"]
        sd = np.sqrt(np.diag(np.asarray(post.covariance)))
        idx = np.arange(len(sd)) + offset
        left.errorbar(idx, np.asarray(post.mean), yerr=2 * sd, fmt="o", ms=3, capsize=2, label=r["name"])
    left.set_xlabel("coefficient (last = intercept)")
    left.set_ylabel("posterior mean ± 2 sd")
    left.set_title("q(w): full vs diagonal covariance")
    left.legend(fontsize=8)
    for r in rows:
        trace = np.asarray(r["post"].diagnostics.objective_trace)
        trace = trace[np.isfinite(trace)]
        right.plot(np.arange(len(trace)), trace, marker=".", label=r["name"])
    best = max(r["log_z"] for r in rows)
    right.set_ylim(best - 30, best + 3)
    right.set_xlabel("iteration")
    right.set_ylabel("G-KL bound")
    right.set_title("bound per solver iteration")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="vijax_demo.png", help="where to save the plot")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # a program may choose float64; the library never does

    X, y, X_test, y_test = load_data(args.seed)
    print(f"Breast-cancer logistic regression: {X.shape[0]} training and {X_test.shape[0]} test points, "
          f"D = {X.shape[1]} (with intercept), prior N(0, I)\n")
    rows = fit_all(X, y, X_test, y_test)
    print_table(rows)
    plot(rows, args.output)
    print(f"\nlog Z: a lower bound on the log evidence where 'bound?' says yes. Times exclude compilation.")
    print(f"Plot saved to {args.output}")
    return rows


if __name__ == "__main__":
    main()
