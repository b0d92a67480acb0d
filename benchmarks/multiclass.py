"""Multi-class GP classification: UCI Glass (Khan thesis experiment E11 / Table 5.1), and iris (``--iris``).

A benchmark script, not a test. Glass data: ``../shared/data/uci/glass.data`` (relative to the
repository; ``--data`` overrides): 214 rows, an id column, **9** features (RI, Na, Mg, Al, Si, K,
Ca, Ba, Fe) and the class. The thesis says 8 features; the file has 9 after the id, and all 9 are
used here. Classes 1, 2, 3, 5, 6, 7 (there is no class 4) are mapped to 0 … 5 (C = 6). Features are
standardised with the training split's mean and standard deviation. Split: 80/20 (171 train,
43 test) by a NumPy permutation with seed ``--seed`` (default 0); ``--splits S`` averages S splits
(seeds seed … seed + S − 1).

Prior: C independent GPs with one shared squared-exponential kernel (thesis convention, Sec. 5.7)

    Σ_ij = σ² exp(−½ ‖x_i − x_j‖² / s),    i.e. ``SquaredExponential(lengthscale=√s, variance=σ²)``,

jitter 1e-6, on the grid log s ∈ {−1, −0.5, 0, 0.5, 1} × log σ ∈ {0, 0.5, 1, 1.5, 2, 2.5} (natural
logs; the thesis does not state its grid, but its Table 5.1 values s ∈ {0.5, 1}, σ ∈ {0 … 2.5} read as
logs on such a grid). ``--quick``: log s ∈ {0, 0.5}, log σ ∈ {1, 2}.

Methods (each grid point fitted from scratch):

- ``Stick-PW``: `vj.gp.multiclass.stick_breaking_model` (K = 5 sticks in class order 1, 2, 3, 5, 6, 7)
  with 20-piece quadratic `PiecewiseLogistic` sites and ``vj.GKL()``: log Z is a lower bound on the
  stick-logistic model's evidence (the thesis's Stick-PW).
- ``Stick-EP``: the same model with exact `Logistic` sites and ``vj.EP()``.
- ``Nested-EP``: ``vj.infer(vj.gp.multiclass.model(...), vj.gp.multiclass.NestedEP(tol=1e-4))`` on the multinomial
  probit (initial damping 0.7, tol 1e-4: the energy is then accurate to ~1e-8),
  predictions by `predict_proba(result, X_test, rule="ep")`.
- ``Softmax-Boh``, ``Softmax-log``, ``Softmax-tilted``: `vj.gp.softmax.SoftmaxBound` on the same model, the multinomial-logit
  (softmax) model with the Böhning, log or full-covariance tilted bound (the thesis's Logit-Boh and
  Logit-log; lower bounds on the logit model's evidence), predictions by Monte Carlo.

Reported per method: the grid point with the smallest −log Z on the training set (the thesis's
"star"), −log Z there, the test prediction error −(1/T) Σ log₂ p(y_t | x_t, data) there, and the test
error rate; also the best test error over the grid, the seconds per fit (median over the grid, after
one warm-up fit that includes compilation; compilation time reported apart), and how many fits
converged. Thesis Table 5.1 (negLogLik / predError at its star): Logit HMC 198.63 / 0.92,
Logit-Boh 239.28 / 1.31, Logit-log 208.26 / 1.13, Probit-VB 203.59 / 1.23, Stick-PW 194.16 / 1.07.
The thesis's split and grid are not published, so only the magnitudes are comparable; the stick
and probit models are different likelihoods from the logit model (HMC), so their log Z are not
bounds on each other.

``--iris``: the multi-class GP methods side by side on iris, which to use when (`docs/guide/multiclass.md`).
Iris (scikit-learn's copy: 150 × 4, C = 3), features standardised, a 100/50 split by a NumPy permutation
with seed 0; one shared squared-exponential kernel (lengthscale 1, variance 4); each method with its
defaults. For each: log Z (an EP estimate or a lower bound, of each method's own likelihood: probit,
softmax or stick-breaking logistic, so not comparable across likelihoods), test accuracy, mean test log
predictive probability, and the wall time of the first call (compilation included). Printed only.

Run (float64 is switched on here; 2 shared CPU cores)::

    python benchmarks/multiclass.py            # Glass, full grid, 1 split
    python benchmarks/multiclass.py --quick    # Glass, 2 × 2 grid
    python benchmarks/multiclass.py --methods Softmax-Boh --update   # add or redo Glass rows
    python benchmarks/multiclass.py --iris     # iris, about a minute

``--update`` keeps the other methods' results from the existing ``.json`` (same splits and grid).

Writes ``benchmarks/results/glass_multiclass.txt`` and ``.json`` (``--quick``:
``/tmp/glass_multiclass_quick.*``; ``--out DIR`` overrides).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import pathlib
import platform

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np

import vijax as vj

from _common import RESULTS, timed

mc = vj.gp.multiclass
SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"
CLASSES = (1, 2, 3, 5, 6, 7)
LOG_S = (-1.0, -0.5, 0.0, 0.5, 1.0)
LOG_SIGMA = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
QUICK_LOG_S, QUICK_LOG_SIGMA = (0.0, 0.5), (1.0, 2.0)
THESIS = {  # Khan thesis Table 5.1: (s, σ, negLogLik, predError)
    "Logit HMC": (1, 2.5, 198.63, 0.92),
    "Logit-Boh": (1, 0.5, 239.28, 1.31),
    "Logit-log": (1, 1, 208.26, 1.13),
    "Probit-VB": (0.5, 0, 203.59, 1.23),
    "Stick-PW": (0.5, 2, 194.16, 1.07),
}
METHODS = ("Stick-PW", "Stick-EP", "Nested-EP", "Softmax-Boh", "Softmax-log", "Softmax-tilted")
SOFTMAX_BOUNDS = {"Softmax-Boh": "bohning", "Softmax-log": "log", "Softmax-tilted": "tilted"}
JITTER = 1e-6


def load(path):
    raw = np.loadtxt(path, delimiter=",")
    X, label = raw[:, 1:-1], raw[:, -1].astype(int)
    return X, np.searchsorted(CLASSES, label)


def split(X, y, seed):
    perm = np.random.default_rng(seed).permutation(len(y))
    n_train = int(round(0.8 * len(y)))
    tr, te = perm[:n_train], perm[n_train:]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def kernel(log_s, log_sigma):
    return vj.gp.kernels.SquaredExponential(lengthscale=math.exp(0.5 * log_s), variance=math.exp(2 * log_sigma))


def fit(method, k, X, y, Xt):
    """(log Z, test probabilities (T, C), converged)."""
    C = len(CLASSES)
    if method == "Nested-EP":
        r = vj.infer(mc.model(k, X, y, C, jitter=JITTER), mc.NestedEP(tol=1e-4))
        return r.log_z, mc.predict_proba(r, Xt), r.diagnostics.converged
    if method in SOFTMAX_BOUNDS:
        r = vj.infer(mc.model(k, X, y, C, jitter=JITTER), vj.gp.softmax.SoftmaxBound(SOFTMAX_BOUNDS[method], tol=1e-9))
        return r.log_z, vj.gp.softmax.predict_proba(r, Xt, key=jax.random.PRNGKey(0)), r.diagnostics.converged
    pieces, inference = (20, vj.GKL()) if method == "Stick-PW" else (None, vj.EP())
    post = vj.infer(mc.stick_breaking_model(k, X, y, C, pieces=pieces, jitter=JITTER), inference)
    return post.log_z, mc.stick_breaking_proba(post, Xt), post.diagnostics.converged


def run_grid(method, data, log_s, log_sigma):
    X, y, Xt, yt = data
    rows, times, compile_s = [], [], None
    for ls in log_s:
        for lsig in log_sigma:
            k = kernel(ls, lsig)
            (log_z, proba, converged), (elapsed,) = timed(fit, method, k, X, y, Xt)
            if compile_s is None:
                compile_s = elapsed  # first fit: includes compilation; same shapes compile once
                (log_z, proba, converged), (elapsed,) = timed(fit, method, k, X, y, Xt)
            times.append(elapsed)
            p = np.asarray(proba)[np.arange(len(yt)), yt]
            rows.append(dict(log_s=ls, log_sigma=lsig, neg_log_z=-float(log_z),
                             pred_error_bits=float(-np.mean(np.log2(np.maximum(p, 1e-300)))),
                             error_rate=float(np.mean(np.argmax(np.asarray(proba), 1) != yt)),
                             sum_check=float(np.max(np.abs(np.asarray(proba).sum(1) - 1))),
                             converged=bool(converged), seconds=elapsed))
    return rows, float(np.median(times)), compile_s


def summarise(rows):
    finite = [r for r in rows if math.isfinite(r["neg_log_z"])]
    star = min(finite, key=lambda r: r["neg_log_z"])
    return dict(star=star, best_pred_error_bits=min(r["pred_error_bits"] for r in rows),
                converged=sum(r["converged"] for r in rows), num_fits=len(rows))


def iris():
    """The multi-class methods with their defaults on iris (the multi-class guide's table)."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    idx = np.random.default_rng(0).permutation(len(y))
    train, test = idx[:100], idx[100:]
    k = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=4.0)
    model = mc.model(k, X[train], y[train], 3)
    stick = mc.stick_breaking_model(k, X[train], y[train], 3)
    softmax = lambda p: vj.gp.softmax.predict_proba(p, X[test], key=jax.random.PRNGKey(0))
    runs = [("nested EP (probit)", lambda: vj.infer(model, mc.NestedEP()), lambda p: mc.predict_proba(p, X[test])),
            ("softmax, Böhning bound", lambda: vj.infer(model, vj.gp.softmax.SoftmaxBound("bohning")), softmax),
            ("softmax, log bound", lambda: vj.infer(model, vj.gp.softmax.SoftmaxBound("log")), softmax),
            ("stick-breaking, G-KL", lambda: vj.infer(stick, vj.GKL()), lambda p: mc.stick_breaking_proba(p, X[test]))]
    print(f"{'method':24s} {'log Z':>9s} {'bound':>6s} {'test acc':>9s} {'test log p':>11s} {'time (s)':>9s}")
    for name, run, predict in runs:
        post, (elapsed,) = timed(run)
        p = np.asarray(predict(post))
        accuracy = np.mean(p.argmax(1) == y[test])
        log_p = np.mean(np.log(p[np.arange(len(test)), y[test]]))
        print(f"{name:24s} {float(post.log_z):9.2f} {str(bool(post.is_lower_bound)):>6s} {accuracy:9.3f} "
              f"{log_p:11.4f} {elapsed:9.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iris", action="store_true", help="the methods side by side on iris instead (printed)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--splits", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--data", type=pathlib.Path, default=SHARED / "data" / "uci" / "glass.data")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--update", action="store_true", help="keep other methods' rows from the existing .json")
    args = parser.parse_args()
    if args.iris:
        return iris()
    out_dir = args.out or (pathlib.Path("/tmp") if args.quick else RESULTS)
    stem = "glass_multiclass_quick" if args.quick else "glass_multiclass"
    log_s, log_sigma = (QUICK_LOG_S, QUICK_LOG_SIGMA) if args.quick else (LOG_S, LOG_SIGMA)
    X, y = load(args.data)

    results = {m: [] for m in args.methods}
    previous = out_dir / f"{stem}.json"
    if args.update and previous.exists():
        old = json.loads(previous.read_text())
        same = (old["meta"]["log_s"] == list(log_s) and old["meta"]["log_sigma"] == list(log_sigma)
                and all(len(runs) == args.splits and runs[0]["seed"] == args.seed for runs in old["results"].values()))
        if not same:
            raise SystemExit(f"--update: {previous} has other splits or another grid; run without --update.")
        results = {m: old["results"].get(m, []) for m in METHODS if m in old["results"] or m in args.methods}
        results.update({m: [] for m in args.methods})
    for i in range(args.splits):
        data = split(X, y, args.seed + i)
        for m in args.methods:
            rows, per_fit, compile_s = run_grid(m, data, log_s, log_sigma)
            results[m].append(dict(seed=args.seed + i, grid=rows, seconds_per_fit=per_fit, first_fit_seconds=compile_s,
                                   **summarise(rows)))
            s = results[m][-1]["star"]
            print(f"split {args.seed + i} {m:10s} star log s={s['log_s']:+.1f} log σ={s['log_sigma']:.1f} "
                  f"−log Z={s['neg_log_z']:.2f} predError={s['pred_error_bits']:.3f} ({per_fit:.2f} s/fit)", flush=True)

    text = io.StringIO()
    n_train = int(round(0.8 * len(y)))
    print(f"UCI Glass, {n_train} train / {len(y) - n_train} test, C = 6, 9 standardised features, "
          f"{args.splits} split(s) from seed {args.seed}; grid log s ∈ {list(log_s)}, log σ ∈ {list(log_sigma)}",
          file=text)
    print("−log Z on the training set at the star (argmin over the grid); predError = mean −log₂ p(y_test) there.",
          file=text)
    header = (f"{'method':12s} {'log s':>6s} {'log σ':>6s} {'−log Z':>9s} {'predError':>9s} {'err rate':>8s} "
              f"{'best pE':>8s} {'s/fit':>7s} {'1st fit':>8s} {'conv':>6s}")
    print(header, file=text)
    print("-" * len(header), file=text)
    for m in results:
        runs = results[m]
        mean = lambda f: float(np.mean([f(r) for r in runs]))
        star = runs[0]["star"]
        pos = (f"{star['log_s']:+6.1f} {star['log_sigma']:6.1f}" if len(runs) == 1 else f"{'(var)':>6s} {'':6s}")
        print(f"{m:12s} {pos} {mean(lambda r: r['star']['neg_log_z']):9.2f} "
              f"{mean(lambda r: r['star']['pred_error_bits']):9.3f} {mean(lambda r: r['star']['error_rate']):8.3f} "
              f"{mean(lambda r: r['best_pred_error_bits']):8.3f} {mean(lambda r: r['seconds_per_fit']):7.2f} "
              f"{mean(lambda r: r['first_fit_seconds']):8.1f} "
              f"{sum(r['converged'] for r in runs):3d}/{sum(r['num_fits'] for r in runs):<3d}", file=text)
    print("\nThesis Table 5.1 (its own split and grid; s, σ as printed):", file=text)
    for name, (s, sig, nll, pe) in THESIS.items():
        print(f"{name:12s} {s:>6} {sig:>6} {nll:9.2f} {pe:9.2f}", file=text)
    report = text.getvalue()
    print("\n" + report)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.txt").write_text(report)
    meta = dict(machine=platform.platform(), processor=platform.processor(), jax=jax.__version__,
                devices=[str(d) for d in jax.devices()], quick=args.quick, log_s=list(log_s),
                log_sigma=list(log_sigma), jitter=JITTER, thesis_table_5_1=THESIS)
    (out_dir / f"{stem}.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print(f"wrote {out_dir / stem}.txt and .json")


if __name__ == "__main__":
    main()
