"""Small problems at the speed of their arithmetic: compiled default fits on breast cancer, D = 6 … 33.

A benchmark script, not a test. For each D, logistic regression on the first D − 1 standardised
breast-cancer features plus an intercept (N = 569), every method's default fit is compiled once and
then timed (CPU milliseconds per call, the best of ``--repeats`` calls after one warm-up, one core).
The issue's target: the default G-KL within 5× Laplace at D = 31, and no step in cost between
D = 32 and 33.

Run (one core, idle machine)::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python benchmarks/small_problems.py

Writes ``benchmarks/results/small_problems.txt`` (``small_problems_<tag>.txt`` with ``--tag``).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import Tee  # noqa: E402

METHODS = {"G-KL": vj.GKL, "EP": vj.EP, "Laplace": vj.Laplace, "LVB": vj.LVB}


def data():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return np.hstack([np.ones((X.shape[0], 1)), X]), y.astype(float)


def cpu_ms(fn, repeats):
    jax.block_until_ready(fn())
    best = np.inf
    for _ in range(repeats):
        start = time.process_time()
        jax.block_until_ready(fn())
        best = min(best, time.process_time() - start)
    return 1e3 * best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="6,16,31,32,33")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    X, y = data()
    dims = [int(d) for d in args.dims.split(",")]
    names = args.methods.split(",")
    log = Tee()
    log(f"CPU ms per compiled default fit, breast cancer (N = {X.shape[0]}), best of {args.repeats}")
    log(f"{'D':>4}  " + "  ".join(f"{n:>9}" for n in names) + "  iterations (G-KL)  G-KL / Laplace")
    for d in dims:
        Xd = X[:, :d] if d <= X.shape[1] else np.hstack([X, np.random.default_rng(d).normal(size=(X.shape[0], d - X.shape[1]))])
        model = vj.glm.logistic_regression(Xd, y)
        times, iters = {}, None
        for name in names:
            method = METHODS[name]()
            fit = jax.jit(lambda model, method=method: vj.infer(model, method))
            times[name] = cpu_ms(lambda: fit(model), args.repeats)
            if name == "G-KL":
                iters = int(fit(model).diagnostics.iterations)
        ratio = times["G-KL"] / times["Laplace"] if {"G-KL", "Laplace"} <= set(times) else float("nan")
        log(f"{d:>4}  " + "  ".join(f"{times[n]:>9.2f}" for n in names) + f"  {iters:>17}  {ratio:>14.1f}")
    log.save("small_problems" + (f"_{args.tag}" if args.tag else ""))


if __name__ == "__main__":
    main()
