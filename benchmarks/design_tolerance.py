"""What G-KL's Newton tolerance changes in a design loop: `vj.design.sequential`'s ``fit_tol`` 1e-6 against 1e-10.

The image model of `design_images.py` (one image, periodic finite differences + Daubechies-4 wavelets, Laplace
potentials, ν² = 0.005, G-KL with a chevron Cholesky factor), N_0 random unit-norm rows, then ``--steps`` free-design
steps of 3 rows, run twice with the same keys: with ``fit_tol=1e-6`` (the design loop's default) and with
``fit_tol=1e-10`` (`vj.solvers.NewtonCG`'s own default). The first fit sees the same data in both runs; later fits
see the rows each run chose. Per fit: ‖m₆ − m₁₀‖/‖m₁₀‖, the ℓ2 errors ‖m − w‖ of both, the largest principal angle
between the two chosen 3-row blocks, the information gains, Newton iterations and fit times (wall and CPU).

    python benchmarks/design_tolerance.py                          # 64 × 64 camera, N_0 = 100, 3 steps
    python benchmarks/design_tolerance.py --size 32 --start 50 --steps 6 --chevron 40 --tag 32
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee  # noqa: E402
from design_images import NU2, image_prior, load_image  # noqa: E402


def largest_angle(a, b):
    """The largest principal angle (radians) between the row spaces of ``a`` and ``b``."""
    qa, _ = np.linalg.qr(a.T)
    qb, _ = np.linalg.qr(b.T)
    cosines = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.arccos(np.clip(cosines.min(), -1.0, 1.0)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--image", default="camera")
    parser.add_argument("--start", type=int, default=100)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chevron", type=int, default=80)
    parser.add_argument("--tols", default="1e-6,1e-10")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    name = "design_tolerance" + (f"_{args.tag}" if args.tag else "")
    log = Tee()
    shape = (args.size, args.size)
    D = args.size**2
    B, prior, _ = image_prior(shape)
    w = load_image(args.image, args.size).ravel()
    rng = np.random.default_rng(100)
    M = rng.normal(size=(args.start, D))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    y = M @ w + np.sqrt(NU2) * rng.normal(size=args.start)
    load = os.getloadavg()
    log(f"# {name}: {args.image} {shape} (D={D}), G-KL chevron K={args.chevron}, N0={args.start}, {args.steps} "
        f"free-design steps of 3 rows, fit_tol {args.tols}; load average at start {load[0]:.2f}, {load[1]:.2f}")
    runs = {}
    for tol in [float(t) for t in args.tols.split(",")]:
        iters = []
        r = vj.design.sequential(M, y, NU2, B, prior, vj.GKL(covariance=vj.covariance.Chevron(args.chevron)),
                                 args.steps, rows_per_step=3, truth=w, key=jax.random.PRNGKey(0), keep_means=True,
                                 fit_tol=tol, callback=lambda k, p: iters.append(int(p.diagnostics.iterations)))
        runs[tol] = (r, iters)
        log(f"fit_tol {tol:g}: l2 errors {', '.join(f'{e:.5f}' for e in r.errors)}; Newton iterations {iters}; "
            f"fit wall s {', '.join(f'{t:.1f}' for t in r.fit_times)}; fit CPU s "
            f"{', '.join(f'{t:.1f}' for t in r.fit_cpu_times)}; converged {r.converged.tolist()}")
    (loose, (a, _)), (tight, (b, _)) = list(runs.items())[:2]
    table = []
    log(f"{'fit':>3} {'N':>5} {'|m_a-m_b|/|m_b|':>16} {'l2 a':>9} {'l2 b':>9} {'block angle (rad)':>17} "
        f"{'gain a':>8} {'gain b':>8}")
    for k in range(len(a.errors)):
        rel = float(np.linalg.norm(a.means[k] - b.means[k]) / np.linalg.norm(b.means[k]))
        if k < args.steps:
            lo, hi = args.start + 3 * k, args.start + 3 * k + 3
            angle = largest_angle(a.rows[lo:hi], b.rows[lo:hi])
            gains = (float(a.gains[k]), float(b.gains[k]))
        else:
            angle, gains = float("nan"), (float("nan"), float("nan"))
        table.append({"N": int(a.num_measurements[k]), "mean_rel_change": rel, "l2": [float(a.errors[k]),
                      float(b.errors[k])], "block_angle": angle, "gains": gains})
        log(f"{k:>3} {a.num_measurements[k]:>5} {rel:>16.2e} {a.errors[k]:>9.5f} {b.errors[k]:>9.5f} {angle:>17.2e} "
            f"{gains[0]:>8.4f} {gains[1]:>8.4f}")
    log(f"(a: fit_tol {loose:g}, b: fit_tol {tight:g}; fit 0 sees the same data in both, fit k the rows each run "
        "chose; the block angle is that of the block chosen from fit k)")
    load = os.getloadavg()
    log(f"# load average at end {load[0]:.2f}, {load[1]:.2f}; 2 cores shared with other programs")
    RESULTS.mkdir(exist_ok=True)
    out = {"args": vars(args), "table": table,
           "runs": {str(t): {"errors": r.errors.tolist(), "fit_times": r.fit_times.tolist(),
                             "fit_cpu_times": r.fit_cpu_times.tolist(), "iterations": it}
                    for t, (r, it) in runs.items()}}
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=1))
    log.save(name)


if __name__ == "__main__":
    main()
