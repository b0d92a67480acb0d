"""Bayesian logistic regression on the breast-cancer data with every vijax method.

Run ``python -m vijax.demo [--output vijax_demo.png] [--seed 0]``. The data (scikit-learn's copy, 569 tumours,
30 features) are split 70/30 by ``--seed`` and standardised, with an intercept column; the prior is N(0, I).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

import vijax as vj

METHODS = [
    ("G-KL full (natural parameters)", vj.GKL()),
    ("G-KL diagonal, Newton-CG", vj.GKL(covariance=vj.covariance.Diagonal())),
    ("Laplace", vj.Laplace()),
    ("MAP", vj.MAP()),
    ("EP, parallel", vj.EP()),
    ("LVB, Jaakkola", vj.LVB()),
    ("mean field", vj.MeanField()),
]

COEFFICIENT_PANEL = ("G-KL full (natural parameters)", "G-KL diagonal, Newton-CG")


def load_data(seed: int = 0, test_fraction: float = 0.3):
    """Standardised breast-cancer features with an intercept column: X, y, X_test, y_test (y in {0, 1})."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    n_train = int(round((1 - test_fraction) * len(y)))
    train, test = order[:n_train], order[n_train:]
    mu, sd = X[train].mean(0), X[train].std(0)
    Z = np.hstack([(X - mu) / sd, np.ones((len(y), 1))])
    y = y.astype(float)
    return Z[train], y[train], Z[test], y[test]


def compile_all(methods, model):
    """Each method's fit, compiled ahead of time: [(compiled, seconds)], XLA compiling in parallel threads."""
    def compile_one(low):
        start = time.perf_counter()
        return low.compile(), time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(compile_one, jax.jit(lambda m, method=method: vj.infer(m, method)).lower(model))
                   for method in methods]
        return [f.result() for f in futures]


def fit_and_evaluate(name, compiled, compile_seconds, model, X_test, y_test):
    """Run a compiled fit once, time it, and evaluate on the test set: one table row (a dict)."""
    start = time.perf_counter()
    post = jax.block_until_ready(compiled(model))
    run_seconds = time.perf_counter() - start
    proba = np.asarray(vj.glm.predict_proba(post, X_test))
    return dict(
        name=name, post=post,
        log_z=float(post.log_z), lower_bound=post.is_lower_bound,
        test_ll=float(np.mean(vj.glm.log_predictive(post, X_test, y_test))),
        accuracy=float(np.mean((proba > 0.5) == (y_test > 0.5))),
        iterations=int(post.diagnostics.iterations), converged=bool(post.diagnostics.converged),
        compile_seconds=compile_seconds, run_seconds=run_seconds,
    )


def format_table(rows) -> str:
    width = max(len("method"), *(len(r["name"]) for r in rows))
    header = (f"{'method':<{width}}  {'log Z':>9}  {'bound?':>6}  {'test LL/pt':>10}  {'accuracy':>8}  "
              f"{'iters':>5}  {'conv':>5}  {'compile s':>9}  {'run s':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['name']:<{width}}  {r['log_z']:>9.3f}  {('yes' if r['lower_bound'] else 'no'):>6}  "
                     f"{r['test_ll']:>10.4f}  {r['accuracy']:>8.3f}  {r['iterations']:>5d}  "
                     f"{('yes' if r['converged'] else 'NO'):>5}  {r['compile_seconds']:>9.2f}  {r['run_seconds']:>8.4f}")
    return "\n".join(lines)


def plot(rows, path, feature_names):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw=dict(width_ratios=[1.6, 1, 1]))
    by_name = {r["name"]: r for r in rows}
    panel = {f"{n}  (log Z ≥ {by_name[n]['log_z']:.1f})": by_name[n]["post"]
             for n in COEFFICIENT_PANEL if n in by_name}
    vj.plot.coefficients(panel, names=feature_names, ax=left)
    left.set_title("q(w): full vs diagonal covariance")
    # Only bounds share an axis: other methods' objectives are not comparable.
    bounds = {r["name"]: r["post"] for r in rows if r["lower_bound"]}
    vj.plot.convergence(bounds, ax=middle)
    vj.plot.convergence(bounds, ax=right, gap=True)
    best = max(float(post.log_z) for post in bounds.values())
    middle.set_ylim(best - 40, best + 4)
    middle.set(xlabel="solver iteration", ylabel="G-KL bound on log Z", title="bound per iteration")
    right.set(xlabel="solver iteration", ylabel="final bound − bound", title="convergence to each fit's own optimum")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Bayesian logistic regression on the breast-cancer data "
                                                 "with every vijax method.")
    parser.add_argument("--output", default="vijax_demo.png", help="where to save the plot (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the 70/30 train/test split (default: %(default)s)")
    args = parser.parse_args(argv)
    # A program may choose float64; the library never changes global JAX configuration.
    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()

    from sklearn.datasets import load_breast_cancer

    feature_names = list(load_breast_cancer().feature_names) + ["intercept"]
    X, y, X_test, y_test = load_data(args.seed)
    print(f"Breast-cancer logistic regression: {X.shape[0]} training and {X_test.shape[0]} test points, "
          f"D = {X.shape[1]} (30 standardised features + intercept), prior N(0, I), float64.\n")
    model = vj.glm.logistic_regression(X, y, prior_variance=1.0)
    compiled = compile_all([method for _, method in METHODS], model)
    print(f"  compiled {len(METHODS)} fits in {time.perf_counter() - start:.1f} s", flush=True)
    rows = [fit_and_evaluate(name, fit, seconds, model, X_test, y_test)
            for (name, _), (fit, seconds) in zip(METHODS, compiled)]
    print("\n" + format_table(rows))
    print("\nlog Z: the method's log-evidence estimate, a guaranteed lower bound where 'bound?' says yes "
          "(for MAP: the log joint at the mode, not an evidence estimate).\n"
          "test LL/pt: mean log predictive density of the test labels. compile s: XLA compilation, "
          "in parallel with other fits (excluded from run s).")
    plot(rows, args.output, feature_names)
    print(f"\nPlot saved to {args.output}   (total {time.perf_counter() - start:.1f} s)")
    return rows


if __name__ == "__main__":
    main()
