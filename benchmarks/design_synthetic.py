"""Sequential experimental design on synthetic sparse signals (Challis thesis §5.4, Fig. 5.2).

w ∈ R^D drawn i.i.d. from a Laplace (τ = 0.2) or Student-t (ν = 3, σ² = 0.0267) density; B = I, prior matched
to the generator, ν² = 0.005; N_0 random unit-norm rows to start, then designed rows (the leading
eigenvectors of the posterior covariance, by Lanczos; the thesis adds one row per step and does not state
its last N -- it times its fits at N = 110). Methods: G-KL (full covariance), LVB, power EP (η = 0.9; Laplace
only, as in the thesis) with the free design, and MAP with random unit-norm rows (`MAP Rand`). Reports the
ℓ2 reconstruction error ‖m − w‖ against N (mean ± s.e. over experiments), the paired difference of each
designed method from MAP Rand, a plot, and the time of one warm-started fit at N = 110 beside the thesis's
(D = 512: LVB 0.3 s, G-EP 0.6 s, G-KL 1.6 s for Laplace; LVB 0.3 s, G-KL 6 s for Student-t; MATLAB on a
2.5 GHz Core 2 Quad).

Every finished (prior, experiment, method) run is appended at once to
``results/design_synthetic_<tag>_runs.jsonl`` and the summary (JSON, TXT, PNG) is rewritten after each
experiment, so a run cut short keeps what it did; started again with the same arguments it skips the runs
already recorded, and ``--combine`` merges the records of several tags (e.g. one process per prior).

    python benchmarks/design_synthetic.py                       # the thesis's sizes (slow on 2 cores)
    python benchmarks/design_synthetic.py --dim 128 --experiments 3 --steps 25 --start 20 --priors laplace --tag reduced
    python benchmarks/design_synthetic.py --priors student_t --tag t_part   # then:
    python benchmarks/design_synthetic.py --combine l_part,t_part --tag both
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
ORDER = ("G-KL", "LVB", "EP", "MAP Rand")


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


def problem(kind, e, dim, start):
    """Experiment e's signal, starting rows and measurements (the same for every method)."""
    rng = np.random.default_rng(1000 + e)
    w = signal(rng, kind, dim)
    M = rng.normal(size=(start, dim))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    y = M @ w + np.sqrt(NU2) * rng.normal(size=start)
    return w, M, y


def config_of(args):
    return {"dim": args.dim, "start": args.start, "steps": args.steps, "rows": args.rows}


def read_runs(tag, config=None):
    """The recorded runs of ``tag`` (those made with ``config`` when given)."""
    path = RESULTS / f"design_synthetic_{tag}_runs.jsonl"
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        try:
            run = json.loads(line)
        except json.JSONDecodeError:  # a line cut off by a kill
            continue
        if config is None or run["config"] == config:
            runs.append(run)
    return runs


def summarise(runs, log, at=None):
    """Curves (mean ± s.e. over experiments) per prior and method, and paired differences from MAP Rand."""
    curves, paired = {}, {}
    for kind in dict.fromkeys(r["prior"] for r in runs):
        mine = [r for r in runs if r["prior"] == kind]
        by_method = {}
        for r in mine:
            by_method.setdefault(r["method"], {})[r["experiment"]] = r
        curves[kind] = {}
        for label in [m for m in ORDER if m in by_method] + [m for m in by_method if m not in ORDER]:
            recs = by_method[label]
            N = recs[next(iter(recs))]["N"]
            errs = np.array([recs[e]["errors"] for e in sorted(recs)])
            n = len(errs)
            curves[kind][label] = {"N": N, "mean": errs.mean(0).tolist(), "n": n,
                                   "se": (errs.std(0, ddof=1) / np.sqrt(n)).tolist() if n > 1 else [float("nan")] * len(N),
                                   "converged": float(np.mean([np.mean(recs[e]["converged"]) for e in recs])),
                                   "fit_cpu_s": mean_se([c for e in recs for c in recs[e]["fit_cpu_s"][1:]])}
        N = curves[kind][next(iter(curves[kind]))]["N"]
        cols = sorted(set([0, len(N) - 1] + ([N.index(a) for a in at if a in N] if at else
                                             list(np.linspace(0, len(N) - 1, 6).astype(int)))))
        log(f"## {kind}: l2 error, mean ± s.e. over experiments (n), at N = {[N[c] for c in cols]}")
        for label, c in curves[kind].items():
            log(f"{kind:9s} {label:9s} (n={c['n']:2d}) " + "  ".join(f"{c['mean'][k]:.3f} ± {c['se'][k]:.3f}" for k in cols)
                + f"   fit CPU s (warm) {c['fit_cpu_s'][0]:.2f}; converged {100 * c['converged']:.0f}%")
        if "MAP Rand" in by_method:
            paired[kind] = {}
            base = by_method["MAP Rand"]
            for label in curves[kind]:
                if label == "MAP Rand":
                    continue
                common = sorted(set(by_method[label]) & set(base))
                if not common:
                    continue
                d = np.array([np.array(base[e]["errors"]) - np.array(by_method[label][e]["errors"]) for e in common])
                wins = (d > 0).sum(0)
                se = d.std(0, ddof=1) / np.sqrt(len(common)) if len(common) > 1 else np.full(d.shape[1], np.nan)
                paired[kind][label] = {"N": N, "n": len(common), "mean": d.mean(0).tolist(), "se": se.tolist(),
                                       "wins": wins.tolist()}
                log(f"{kind:9s} MAP Rand − {label:5s} (n={len(common):2d}) "
                    + "  ".join(f"{d.mean(0)[k]:+.3f} ± {se[k]:.3f} ({wins[k]}/{len(common)})" for k in cols))
    return curves, paired


def write_summary(name, runs, header, timing=None, at=None):
    log = Tee()
    log(header)
    curves, paired = summarise(runs, log, at)
    for kind, t in (timing or {}).items():
        for label, v in t.items():
            log(f"{kind:9s} {label:9s} N=110: first fit (with compilation) {v['cold_s']:.2f} s, warm-started fit "
                f"(compiled) {v['warm_s']:.2f} s; thesis {v['thesis_s']} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"header": header, "curves": curves, "paired": paired,
                                                      "timing": timing or {}}, indent=1))
    log.save(name)
    if curves:
        plot(curves, runs[0]["config"]["dim"], RESULTS / f"{name}.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--start", type=int, default=40)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--experiments", type=int, default=25)
    parser.add_argument("--first-experiment", type=int, default=0)
    parser.add_argument("--rows", type=int, default=1, help="designed rows per step")
    parser.add_argument("--priors", default="laplace,student_t")
    parser.add_argument("--methods", default=",".join(ORDER))
    parser.add_argument("--at", default=None, help="comma-separated N at which the tables report the error")
    parser.add_argument("--timing-dim", type=int, default=512, help="D of the single timed fit at N = 110")
    parser.add_argument("--timing-only", action="store_true", help="only the timed fits at N = 110")
    parser.add_argument("--no-timing", action="store_true", help="skip the timed fits at N = 110")
    parser.add_argument("--combine", default=None, help="comma-separated tags whose recorded runs to merge under --tag")
    parser.add_argument("--note", default="", help="a line added to the summary's header")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    name = "design_synthetic" + (f"_{args.tag}" if args.tag else "")
    at = [int(a) for a in args.at.split(",")] if args.at else None
    if args.combine:
        runs = [r for t in args.combine.split(",") for r in read_runs(t)]
        configs = {json.dumps(r["config"], sort_keys=True) for r in runs}
        if len(configs) != 1:
            raise SystemExit(f"--combine: the runs have different set-ups {sorted(configs)}")
        c = runs[0]["config"]
        header = (f"# {name}: merged from {args.combine}; D={c['dim']}, N0={c['start']}, {c['steps']} steps of "
                  f"{c['rows']} rows, nu2={NU2}" + (f"\n# {args.note}" if args.note else ""))
        return write_summary(name, runs, header, at=at)
    config = config_of(args)
    header = (f"# {name}: D={args.dim}, N0={args.start}, steps={args.steps} ({args.rows} rows each), "
              f"experiments={args.first_experiment}..{args.first_experiment + args.experiments - 1}, nu2={NU2}"
              + (f"\n# {args.note}" if args.note else ""))
    print(header, flush=True)
    RESULTS.mkdir(exist_ok=True)
    runs_path = RESULTS / f"{name}_runs.jsonl"
    done = {(r["prior"], r["method"], r["experiment"]) for r in read_runs(args.tag, config)}
    wanted = args.methods.split(",")
    timing = {}
    for kind in args.priors.split(","):
        prior = prior_of(kind)
        methods = {k: v for k, v in methods_for(kind).items() if k in wanted}
        for e in ([] if args.timing_only else range(args.first_experiment, args.first_experiment + args.experiments)):
            w, M, y = problem(kind, e, args.dim, args.start)
            for label, (method, design) in methods.items():
                if (kind, label, e) in done:
                    continue
                start = time.perf_counter()
                r = vj.design.sequential(M, y, NU2, vj.Identity(args.dim), prior, method, args.steps,
                                         rows_per_step=args.rows, design=design, truth=w, key=jax.random.PRNGKey(e))
                run = {"config": config, "prior": kind, "method": label, "experiment": e,
                       "N": r.num_measurements.tolist(), "errors": r.errors.tolist(), "fit_s": r.fit_times.tolist(),
                       "fit_cpu_s": r.fit_cpu_times.tolist(), "converged": r.converged.tolist(),
                       "wall_s": time.perf_counter() - start, "finished": time.strftime("%H:%M:%S", time.gmtime())}
                with open(runs_path, "a") as f:
                    f.write(json.dumps(run) + "\n")
                print(f"{kind:9s} {label:9s} experiment {e:2d}: error {r.errors[0]:.3f} (N={r.num_measurements[0]}) -> "
                      f"{r.errors[-1]:.3f} (N={r.num_measurements[-1]}) in {run['wall_s']:.0f} s, converged "
                      f"{int(r.converged.sum())}/{len(r.converged)}", flush=True)
            write_summary(name, read_runs(args.tag, config), header, at=at)
        if args.no_timing:
            continue
        # one warm-started fit at N = 110, D = timing_dim, after a compiled first fit of the same shapes
        rng = np.random.default_rng(7)
        D = args.timing_dim
        w = signal(rng, kind, D)
        M = rng.normal(size=(110, D))
        M /= np.linalg.norm(M, axis=1, keepdims=True)
        y = M @ w + np.sqrt(NU2) * rng.normal(size=110)
        timing[kind] = {}
        for label, (method, _) in methods.items():
            if label == "MAP Rand":
                continue
            # fits at N = 108, 109, 110: the first compiles the cold start, the second the warm start, the
            # third (at N = 110) is a compiled, warm-started design-step fit
            r = vj.design.sequential(M[:108], y[:108], NU2, vj.Identity(D), prior, method, 2, design="random",
                                     measure=lambda rows, M=M, w=w: rows @ w, pad=True)
            timing[kind][label] = {"cold_s": float(r.fit_times[0]), "warm_compile_s": float(r.fit_times[1]),
                                   "warm_s": float(r.fit_times[2]), "thesis_s": THESIS_SECONDS[kind].get(label)}
            print(f"{kind:9s} {label:9s} D={D} N=110: warm-started fit {r.fit_times[2]:.2f} s", flush=True)
    write_summary(name, read_runs(args.tag, config), header, timing=timing, at=at)


def plot(curves, dim, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(curves)
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        n = min(c["n"] for c in curves[kind].values())
        plot_error_curves(ax, curves[kind], f"{kind} signals, D = {dim} ({n}+ experiments)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
