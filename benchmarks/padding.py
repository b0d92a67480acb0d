"""Cross-validation folds of unequal size: one compilation with `vj.pad_sites`, one per size without.

A benchmark script, not a test. The folds are random subsets of the demo's breast-cancer training data
(``vijax.demo.load_data``: D = 31 with the intercept) of 90, 95, …, 110 points; each is a logistic
regression fitted by ``fit = jax.jit(lambda m: vj.infer(m, method))``, G-KL by default:

- ``unpadded``: ``fit(model)``; every new N is a new shape, so a new compilation;
- ``padded``: ``fit(vj.pad_sites(model, 112))``; every fold has 112 sites (its own, then copies of its
  last one, masked out), so one program serves them all.

Each mode runs in a fresh Python process (nothing compiled before is reused), float64. The models are
built before the clock starts; each fit is timed from the call to ``jax.block_until_ready``. Compilations
are counted twice: the jitted function's cache entries (``fit._cache_size()``) and XLA backend
compilations during the fits (``jax.monitoring`` events). The table also gives the largest differences
between the padded and unpadded answers (log Z, mean, covariance) over the folds: zero up to rounding.

Run::

    python benchmarks/padding.py                         # G-KL, folds of 90, 95, …, 110 points; ~1 minute
    python benchmarks/padding.py --methods gkl ep laplace --sizes 90 100 110 --size 112

Writes ``benchmarks/results/padding.txt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from _common import RESULTS, timed

HERE = pathlib.Path(__file__).resolve()
METHODS = {
    "gkl": "vj.GKL()",
    "gkl_diagonal": "vj.GKL(covariance=vj.covariance.Diagonal())",
    "ep": "vj.EP()",
    "laplace": "vj.Laplace()",
    "map": "vj.MAP()",
    "lvb": "vj.LVB()",
    "meanfield": "vj.MeanField()",
}


def folds(sizes, seed):
    """One random training subset of each size from the demo's training data."""
    import numpy as np

    from vijax.demo import load_data

    X, y, _, _ = load_data()
    rng = np.random.default_rng(seed)
    return [(X[idx], y[idx]) for idx in (rng.choice(len(y), size=n, replace=False) for n in sizes)]


def worker(method_name, mode, sizes, size, seed):
    """Runs in a fresh process; prints one JSON line: per fold, the time and compilations of its fit."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import vijax as vj

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(seconds) if event == "/jax/core/compile/backend_compile_duration" else None)

    method = eval(METHODS[method_name], {"vj": vj})  # noqa: S307 - expressions from this file
    fit = jax.jit(lambda m: vj.infer(m, method))
    models = [vj.glm.logistic_regression(X, y) for X, y in folds(sizes, seed)]
    if mode == "padded":
        models = [vj.pad_sites(m, size) for m in models]
    jax.block_until_ready(models)
    rows = []
    for n, model in zip(sizes, models):
        before = len(compiles)
        post, (seconds,) = timed(fit, model)
        d = post.diagnostics
        rows.append(dict(n=n, seconds=seconds, backend_compiles=len(compiles) - before,
                         compile_seconds=sum(compiles[before:]), log_z=float(post.log_z),
                         mean=np.asarray(post.mean).tolist(), covariance=np.asarray(post.covariance).tolist(),
                         iterations=int(d.iterations), converged=bool(d.converged)))
    print(json.dumps(dict(rows=rows, cache_size=fit._cache_size())))


def run(method_name, mode, args):
    command = [sys.executable, str(HERE), "--worker", method_name, mode, "--sizes", *map(str, args.sizes),
               "--size", str(args.size), "--seed", str(args.seed)]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{method_name} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["gkl"], choices=list(METHODS))
    parser.add_argument("--sizes", nargs="+", type=int, default=[90, 95, 100, 105, 110],
                        help="training points per fold (default: 90 95 100 105 110)")
    parser.add_argument("--size", type=int, default=112, help="the padded number of sites (default 112)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.sizes, args.size, args.seed)
        return

    import numpy as np

    lines, records = [], []
    header = (f"{'method':<13} {'N':>4} | {'unpadded s':>10} {'compiles':>8} | {'padded s':>8} {'compiles':>8} | "
              f"{'|Δ log Z|':>9} {'|Δ mean|':>9} {'|Δ cov|':>9}")
    for name in args.methods:
        results = {mode: run(name, mode, args) for mode in ("unpadded", "padded")}
        lines += [f"{name}: folds of {args.sizes} points, padded to {args.size} sites "
                  f"(jit cache entries: unpadded {results['unpadded']['cache_size']}, "
                  f"padded {results['padded']['cache_size']})", header, "-" * len(header)]
        for a, b in zip(results["unpadded"]["rows"], results["padded"]["rows"]):
            diff = lambda key: float(np.max(np.abs(np.asarray(a[key]) - np.asarray(b[key]))))
            lines.append(f"{name:<13} {a['n']:>4} | {a['seconds']:>10.2f} {a['backend_compiles']:>8} | "
                         f"{b['seconds']:>8.2f} {b['backend_compiles']:>8} | "
                         f"{diff('log_z'):>9.1e} {diff('mean'):>9.1e} {diff('covariance'):>9.1e}")
        total = {mode: sum(r["seconds"] for r in results[mode]["rows"]) for mode in results}
        count = {mode: sum(r["backend_compiles"] for r in results[mode]["rows"]) for mode in results}
        lines += [f"{name:<13} {'all':>4} | {total['unpadded']:>10.2f} {count['unpadded']:>8} | "
                  f"{total['padded']:>8.2f} {count['padded']:>8} |", ""]
        for mode, result in results.items():
            for row in result["rows"]:
                records.append(dict(method=name, mode=mode, size=args.size if mode == "padded" else row["n"],
                                    cache_size=result["cache_size"],
                                    **{k: v for k, v in row.items() if k not in ("mean", "covariance")}))
    import jax

    lines.append(f"JAX {jax.__version__}, float64, {os.cpu_count()} CPU cores (shared); times are the fits' first "
                 "calls (compilation included), the models built beforehand; compiles: XLA backend compilations "
                 "during each fit.")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "padding.txt").write_text(table + "\n")
    (RESULTS / "padding.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
