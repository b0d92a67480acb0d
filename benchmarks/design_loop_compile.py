"""Does a design loop compile its fit once? CPU seconds of each fit of `vj.design.sequential` on a small
model (D = 64, finite differences, Laplace prior; 4 steps of 2 rows): the first fit includes compilation,
and a refit that compiled again would cost as much as the first.

Run: ``python benchmarks/design_loop_compile.py`` (prints one row per method).
"""

import jax
import numpy as np

import vijax as vj

jax.config.update("jax_enable_x64", True)


def main():
    D, N0, nu2 = 64, 8, 0.005
    rng = np.random.default_rng(0)
    truth = np.repeat(rng.normal(size=5), [10, 20, 14, 10, 10])
    M = np.asarray(vj.design.random_rows(jax.random.PRNGKey(2), N0, D))
    y = M @ truth + 0.07 * rng.normal(size=N0)
    B = vj.design.filters.finite_differences((1, D))
    print(f"{'method':<16} fit CPU seconds (first includes compilation)      l2 errors")
    for name, method, design in [("G-KL full", vj.GKL(), "free"),
                                 ("G-KL chevron 8", vj.GKL(covariance=vj.covariance.Chevron(8)), "free"),
                                 ("EP (0.9)", vj.EP(power=0.9), "free"), ("Laplace", vj.Laplace(), "free"),
                                 ("MAP", vj.MAP(), "random")]:
        r = vj.design.sequential(M, y, nu2, B, vj.potentials.Laplace(0.1), method, num_steps=4, rows_per_step=2,
                                 design=design, truth=truth)
        print(f"{name:<16} {np.array2string(r.fit_cpu_times, precision=2):<46} "
              f"{np.array2string(r.errors, precision=4)}", flush=True)


if __name__ == "__main__":
    main()
