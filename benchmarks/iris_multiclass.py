"""The multi-class GP methods side by side on iris: which to use when (`docs/guide/multiclass.md`).

A benchmark script, not a test. Iris (scikit-learn's copy: 150 × 4, C = 3), features standardised,
a 100/50 split by a NumPy permutation with seed 0; one shared squared-exponential kernel
(lengthscale 1, variance 4). For each method: log Z (an EP estimate or a lower bound, of each
method's own likelihood: probit, softmax or stick-breaking logistic, so not comparable across
likelihoods), test accuracy, mean test log predictive probability, and the wall time of the first
call (compilation included).

    python benchmarks/iris_multiclass.py
"""

import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402

import vijax as vj  # noqa: E402


def main():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    idx = np.random.default_rng(0).permutation(len(y))
    train, test = idx[:100], idx[100:]
    mc = vj.gp.multiclass
    kernel = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=4.0)
    model = mc.model(kernel, X[train], y[train], 3)
    stick = mc.stick_breaking_model(kernel, X[train], y[train], 3)
    key = jax.random.PRNGKey(0)
    runs = [
        ("nested EP (probit)", lambda: vj.infer(model, mc.NestedEP()), lambda p: mc.predict_proba(p, X[test])),
        ("softmax, Böhning bound", lambda: vj.infer(model, vj.gp.softmax.SoftmaxBound("bohning")),
         lambda p: vj.gp.softmax.predict_proba(p, X[test], key=key)),
        ("softmax, log bound", lambda: vj.infer(model, vj.gp.softmax.SoftmaxBound("log")),
         lambda p: vj.gp.softmax.predict_proba(p, X[test], key=key)),
        ("stick-breaking, G-KL", lambda: vj.infer(stick, vj.GKL()), lambda p: mc.stick_breaking_proba(p, X[test])),
    ]
    print(f"{'method':24s} {'log Z':>9s} {'bound':>6s} {'test acc':>9s} {'test log p':>11s} {'time (s)':>9s}")
    for name, fit, predict in runs:
        start = time.perf_counter()
        post = fit()
        elapsed = time.perf_counter() - start
        p = np.asarray(predict(post))
        accuracy = np.mean(p.argmax(1) == y[test])
        log_p = np.mean(np.log(p[np.arange(len(test)), y[test]]))
        print(f"{name:24s} {float(post.log_z):9.2f} {str(bool(post.is_lower_bound)):>6s} {accuracy:9.3f} "
              f"{log_p:11.4f} {elapsed:9.1f}")


if __name__ == "__main__":
    main()
