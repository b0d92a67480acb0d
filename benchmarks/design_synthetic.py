"""Sequential experimental design on synthetic sparse signals (Challis thesis §5.4, Fig. 5.2).

w ∈ R^D drawn i.i.d. from a Laplace (τ = 0.2) or Student-t (ν = 3, σ² = 0.0267) density; B = I, prior matched
to the generator, ν² = 0.005; N_0 random unit-norm rows to start, then one designed row per step (the
leading eigenvector of the posterior covariance, by Lanczos). Methods: G-KL (full covariance), LVB, power
EP (η = 0.9; Laplace only, as in the thesis) with the free design, and MAP with random unit-norm rows
(`MAP Rand`). Reports the ℓ2 reconstruction error ‖m − w‖ against N (mean ± s.e. over experiments), a
plot, and the time of one warm-started fit at N = 110 beside the thesis's (D = 512: LVB 0.3 s, G-EP 0.6 s,
G-KL 1.6 s for Laplace; LVB 0.3 s, G-KL 6 s for Student-t; MATLAB on a 2.5 GHz Core 2 Quad).

    python benchmarks/design_synthetic.py                       # the thesis's sizes (slow on 2 cores)
    python benchmarks/design_synthetic.py --dim 128 --experiments 3 --steps 25 --start 20 --priors laplace --tag reduced
    python benchmarks/design_synthetic.py --timing-only --priors laplace --tag timing
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, Tee, mean_se, plot_error_curves  # noqa: E402

NU2 = 0.005
THESIS_SECONDS = {"laplace": {"LVB": 0.3, "EP": 0.6, "G-KL": 1.6}, "student_t": {"LVB": 0.3, "G-KL": 6.0}}


def prior_of(kind):
    if kind == "laplace":
        return vj.potentials.Laplace(scale=0.2)
    return vj.potentials.StudentT(df=3.0, scale=float(np.sqrt(0.0267)))


def signal(rng, kind, dim):
    if kind == "laplace":
        return rng.laplace(0.0, 0.2, size=dim)
    return np.sqrt(0.0267) * rng.standard_t(3.0, size=dim)


def methods_for(kind):
    out = {"G-KL": (vj.GKL(), "free"), "LVB": (vj.LVB(), "free")}
    if kind == "laplace":
        out["EP"] = (vj.EP(power=0.9), "free")
    out["MAP Rand"] = (vj.MAP(), "random")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--start", type=int, default=40)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--experiments", type=int, default=25)
    parser.add_argument("--rows", type=int, default=1, help="designed rows per step")
    parser.add_argument("--priors", default="laplace,student_t")
    parser.add_argument("--timing-dim", type=int, default=512, help="D of the single timed fit at N = 110")
    parser.add_argument("--timing-only", action="store_true", help="only the timed fits at N = 110")
    parser.add_argument("--no-timing", action="store_true", help="skip the timed fits at N = 110")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    name = "design_synthetic" + (f"_{args.tag}" if args.tag else "")
    log = Tee()
    log(f"# {name}: D={args.dim}, N0={args.start}, steps={args.steps} ({args.rows} rows each), experiments={args.experiments}, "
        f"nu2={NU2}")
    results = {"args": vars(args), "curves": {}, "timing": {}}
    for kind in args.priors.split(","):
        prior = prior_of(kind)
        curves = {}
        for label, (method, design) in ({} if args.timing_only else methods_for(kind)).items():
            errs = []
            start = time.perf_counter()
            for e in range(args.experiments):
                rng = np.random.default_rng(1000 + e)
                w = signal(rng, kind, args.dim)
                M = rng.normal(size=(args.start, args.dim))
                M /= np.linalg.norm(M, axis=1, keepdims=True)
                y = M @ w + np.sqrt(NU2) * rng.normal(size=args.start)
                r = vj.design.sequential(M, y, NU2, vj.Identity(args.dim), prior, method, args.steps, rows_per_step=args.rows,
                                         design=design,
                                         truth=w, key=jax.random.PRNGKey(e))
                errs.append(r.errors)
                counts = r.num_measurements
            errs = np.array(errs)
            curves[label] = {"N": counts.tolist(), "mean": errs.mean(0).tolist(),
                             "se": (errs.std(0, ddof=1) / np.sqrt(len(errs))).tolist() if len(errs) > 1 else
                             [float("nan")] * errs.shape[1]}
            m0, s0 = mean_se(errs[:, 0])
            m1, s1 = mean_se(errs[:, -1])
            log(f"{kind:9s} {label:9s} error at N={counts[0]}: {m0:.3f} ± {s0:.3f}; at N={counts[-1]}: "
                f"{m1:.3f} ± {s1:.3f}   ({time.perf_counter() - start:.0f} s for all runs)")
        results["curves"][kind] = curves
        if args.no_timing:
            continue
        # one warm-started fit at N = 110, D = timing_dim, after a compiled first fit of the same shapes
        rng = np.random.default_rng(7)
        D = args.timing_dim
        w = signal(rng, kind, D)
        M = rng.normal(size=(110, D))
        M /= np.linalg.norm(M, axis=1, keepdims=True)
        y = M @ w + np.sqrt(NU2) * rng.normal(size=110)
        timing = {}
        for label, (method, _) in methods_for(kind).items():
            if label == "MAP Rand":
                continue
            # fits at N = 108, 109, 110: the first compiles the cold start, the second the warm start, the
            # third (at N = 110) is a compiled, warm-started design-step fit
            r = vj.design.sequential(M[:108], y[:108], NU2, vj.Identity(D), prior, method, 2, design="random",
                                     measure=lambda rows, M=M, w=w: rows @ w, pad=True)
            timing[label] = {"cold_s": float(r.fit_times[0]), "warm_compile_s": float(r.fit_times[1]),
                             "warm_s": float(r.fit_times[2]), "thesis_s": THESIS_SECONDS[kind].get(label)}
            log(f"{kind:9s} {label:9s} D={D} N=110: first fit (with compilation) {r.fit_times[0]:.2f} s, "
                f"warm-started fit (compiled) {r.fit_times[2]:.2f} s; thesis {THESIS_SECONDS[kind].get(label)} s")
        results["timing"][kind] = timing
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1))
    log.save(name)
    if not args.timing_only:
        plot(results, RESULTS / f"{name}.png")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results["curves"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        plot_error_curves(ax, results["curves"][kind], f"{kind} signals, D = {results['args']['dim']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
