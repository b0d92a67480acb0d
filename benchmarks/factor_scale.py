"""Scale of variational EM for a binary factor model: N = 100,000 points, D = 50, L = 10 (issue target:
under 10 s per EM iteration on a 2-core CPU).

For each bound (Böhning with the shared-covariance E-step, Jaakkola, 20-piece quadratic piecewise) it
runs EM on synthetic data from a random binary factor model and reports the time of each EM
iteration after the first (which includes compilation), the E-step iterations, the bound, and the
process's peak resident memory. Run: ``python benchmarks/factor_scale.py [--n 100000] [--iters 4] [--dtype float32] [--e-step-iters 2]``.
Results go to ``benchmarks/results/factor_scale.txt``.
"""

from __future__ import annotations

import argparse
import resource

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

from _common import Tee, timed  # noqa: E402


def data(n, d, l, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, l)) / np.sqrt(l) * 2.0
    eta = rng.normal(size=(n, l)) @ w.T + rng.normal(size=d) * 0.5
    return (rng.uniform(size=(n, d)) < 1 / (1 + np.exp(-eta))).astype(float)


def run(bound, Y, l, iters, dtype, e_step_iters):
    model = vj.factor.factor_analysis(vj.factor.Bernoulli(bound), l, jax.random.PRNGKey(0), num_columns=Y.shape[1],
                                      dtype=dtype)
    Yj, mask = jnp.asarray(Y, dtype), jnp.ones(Y.shape, bool)
    q = vj.factor.initial_posteriors(model, Y.shape[0])
    times, e_its, bounds = [], [], []

    def em_iteration(model, q):
        q = vj.factor.e_step(model, Yj, mask, q, e_step_iters, complete=True)
        bounds.append(float(jnp.sum(q.bound)))
        return vj.factor.m_step(model, Yj, mask, q), q

    for _ in range(iters):
        (model, q), seconds = timed(em_iteration, model, q)
        times += seconds
        e_its.append(int(jnp.max(q.iterations)))
    return times, e_its, bounds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=50)
    parser.add_argument("--l", type=int, default=10)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--bounds", default="bohning,jaakkola,piecewise")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--e-step-iters", type=int, default=100,
                        help="natural-gradient steps per point per E-step (fewer: partial E-steps, still monotone)")
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    Y = data(args.n, args.d, args.l)
    log = Tee()
    log(f"binary factor analysis, N = {args.n}, D = {args.d}, L = {args.l}, {args.dtype}, "
        f"at most {args.e_step_iters} E-step iterations, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s); target < 10 s per EM iteration",
        f"{'bound':<10} {'first (compile) s':>18} {'later iterations s':>22} {'E-step its':>11} {'bound after E-step':>22}")
    for bound in args.bounds.split(","):
        times, e_its, bounds = run(bound, Y, args.l, args.iters, dtype, args.e_step_iters)
        later = " ".join(f"{t:.2f}" for t in times[1:])
        log(f"{bound:<10} {times[0]:>18.2f} {later:>22} {max(e_its[1:] or e_its):>11d} {bounds[-1]:>22.2f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"peak resident memory of the process: {peak:.0f} MiB")
    suffix = ("" if args.dtype == "float64" else "_" + args.dtype) + (
        "" if args.e_step_iters == 100 else f"_estep{args.e_step_iters}")
    log.save(f"factor_scale{suffix}")


if __name__ == "__main__":
    main()
