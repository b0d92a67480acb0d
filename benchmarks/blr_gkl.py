"""G-KL on the synthetic Bayesian logistic regression of Challis's thesis §5.2, against NumPyro SVI.

A benchmark script, not a test. Data: `vijax.data.synthetic_logistic_regression` with D = 500,
N in {250, 500, 2500}, N_test = 10 D = 5000 (thesis Table 5.2: N_tst = 5000), prior N(0, I).
For the default full-covariance fit ``vj.GKL()`` (the natural-parameter ascent over (m, λ),
S⁻¹ = I + Xᵀdiag(λ)X, in its primal D × D form for N ≥ D and its dual N × N form for N < D) and for
``vj.GKL(covariance=vj.covariance.Full(), solver=...)`` with Newton-CG and L-BFGS it reports

- iterations and the wall time of the default fit (compilation excluded: one compiling call, then
  the median of several timed calls) and max|∇| of the bound in (m, C) at the result;
- the bound's difference from the natural-parameter fit's;
- bound / N, ‖m − w_true‖₂ / D (the brief's metric) and ‖m − w_true‖₂² / D (the magnitude the
  thesis tables print), test log-likelihood per test point;
- the solver's own counts (bound+gradient, Hessian-vector products, bound-only evaluations);
- the evaluation ratio: one jit-compiled bound+gradient evaluation (``jax.value_and_grad`` of
  ``vj.gkl.bound`` on the flat parameter vector, as the solvers call it) at the optimum, over the
  N×D by D×D product ``X @ C.T`` that dominates it; both are medians of interleaved repeats;
- evaluation equivalents: fit time / time of one bound+gradient evaluation;
- for Newton-CG, where the time goes: the measured cost of one Hessian-vector product, one
  preconditioner set-up and one preconditioner application (in bound+gradient units) and the fit
  time these predict from the solver's counts.

Dense Newton (`vj.solvers.Newton`) is skipped: its Hessian over D(D+3)/2 ≈ 125k parameters would
have 1.6e10 entries (125 GB in float64).

In the same run, NumPyro SVI (``AutoMultivariateNormal``, Adam, ``Trace_ELBO`` with one particle) on
the same posterior (w ~ Normal(0, 1) iid, y01 ~ Bernoulli(logits = X w)) runs in jitted chunks; at
every checkpoint the *deterministic* vijax bound is evaluated at its guide (mean = loc, S = LLᵀ from
``scale_tril``), and the SVI time (chunks only) until it comes within 0.1 nat of vijax's optimum is
reported, or, if it never does, the bound it reached and the time spent.

Targets: the natural-parameter fit reaches max|∇| < 1e-3 in ≤ 30 bound+gradient equivalents, with the
bound of Newton-CG to 1e-8; Newton-CG (full Cholesky) ≤ 40 equivalents; evaluation ratio ≤ 2.5;
NumPyro at least 20× slower than the default fit to reach 0.1 nat. The table prints PASS/MISS beside each.

Run (float64 is switched on by this script)::

    python benchmarks/blr_gkl.py            # full: N = 250, 500, 2500; NumPyro up to 20,000 steps
    python benchmarks/blr_gkl.py --quick    # N = 250 only, fewer repeats, NumPyro capped at 5,000 steps
    python benchmarks/blr_gkl.py --seed 3 --no-numpyro

Writes ``benchmarks/results/blr_gkl.json`` and ``blr_gkl.png`` (bound / N against time), or
``blr_gkl_quick.*`` with ``--quick``. Times are from a shared CPU machine: compare ratios within
one run rather than absolute seconds across runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import vijax as vj
from vijax.data import synthetic_logistic_regression
from vijax.methods.gkl import GaussianParams

from _common import RESULTS, timed

DIM = 500
TARGET_EQUIVALENTS = 40.0  # Newton-CG
TARGET_NATURAL = 30.0  # the natural-parameter fit
TARGET_AGREEMENT = 1e-8  # |bound(natural) - bound(Newton-CG)|
TARGET_RATIO = 2.5
TARGET_SPEEDUP = 20.0
NAT = 0.1


def median_times(calls, repeats):
    """Median seconds of each ``(fn, args)`` in ``calls``, after one compiling call each, interleaved
    so that load changes on a shared machine affect every entry alike."""
    for fn, args in calls:
        jax.block_until_ready(fn(*args))
    samples = [[] for _ in calls]
    for _ in range(repeats):
        for store, (fn, args) in zip(samples, calls):
            store += timed(fn, *args)[1]
    return [float(np.median(s)) for s in samples]


def verdict(ok):
    return "PASS" if ok else "MISS"


# ---------------------------------------------------------------------------------------------- vijax
def run_vijax(model, data, label, method, repeats, eval_repeats):
    fit = jax.jit(lambda m: vj.infer(m, method))
    post = jax.block_until_ready(fit(model))  # compiles
    (seconds,) = median_times([(fit, (model,))], repeats)

    d = post.diagnostics
    params = GaussianParams(post.mean, post.factor)
    x, unravel = ravel_pytree(params)
    value_and_grad = jax.jit(jax.value_and_grad(lambda v: vj.gkl.bound(unravel(v), model)))
    H = jnp.asarray(model.sites[0].projection.matrix)  # y_n x_n: the same cost as X
    C = post.factor.cholesky()
    matmul = jax.jit(lambda H, C: H @ C.T)
    t_eval, t_matmul = median_times([(value_and_grad, (x,)), (matmul, (H, C))], eval_repeats)
    grad_norm = float(jnp.max(jnp.abs(value_and_grad(x)[1])))  # in (m, C), the same measure for every fit

    n, dim = data.X_train.shape
    error = np.asarray(post.mean) - data.w_true
    trace = np.asarray(d.objective_trace)
    return dict(
        solver=label, seconds=seconds, iterations=int(d.iterations), converged=bool(d.converged),
        grad_norm=grad_norm, bound=float(post.log_z), bound_per_n=float(post.log_z) / n,
        w_error=float(np.linalg.norm(error) / dim), w_error_sq=float(error @ error / dim),
        test_ll=float(jnp.mean(vj.glm.log_predictive(post, data.X_test, data.y_test))),
        grads=int(d.num_grad_evals), hvps=int(d.num_hvp_evals), values=int(d.num_value_evals),
        eval_seconds=t_eval, matmul_seconds=t_matmul, eval_ratio=t_eval / t_matmul,
        equivalents=seconds / t_eval, trace=[float(v) for v in trace[np.isfinite(trace)]],
    ), post


def newton_cg_breakdown(model, post, result, repeats):
    """Costs of Newton-CG's parts at the optimum, in seconds and in bound+gradient units.

    - ``linearize``: ``jax.linearize`` of value_and_grad (one per accepted Newton step);
    - ``hvp``: one application of the linearised gradient (per CG iteration);
    - ``precond_setup`` and ``precond_apply``: the family's preconditioner, from timing set-up plus
      1 and plus 6 applications (t = setup + k·apply).
    """
    params = GaussianParams(post.mean, post.factor)
    x, unravel = ravel_pytree(params)
    value_and_grad = jax.value_and_grad(lambda v: vj.gkl.bound(unravel(v), model))
    linearize = jax.jit(lambda v: jax.linearize(value_and_grad, v))
    (_, lin_fn) = linearize(x)
    hvp = jax.jit(lambda f, v: f(v)[1])
    v = jax.random.normal(jax.random.key(0), x.shape, x.dtype) * 1e-3

    def precondition(k):
        def run(x, v):
            p = unravel(x)
            apply = p.factor.preconditioner(vj.gkl.curvature(p, model))

            def step(_, u):
                t = unravel(u)
                dm, dfactor = apply(t.mean, t.factor)
                return ravel_pytree(GaussianParams(dm, dfactor))[0]

            return jax.lax.fori_loop(0, k, step, v)

        return jax.jit(run)

    t_lin, t_hvp, t_p1, t_p6 = median_times(
        [(linearize, (x,)), (hvp, (lin_fn, v)), (precondition(1), (x, v)), (precondition(6), (x, v))], repeats)
    t_apply = max(t_p6 - t_p1, 0.0) / 5
    t_setup = max(t_p1 - t_apply, 0.0)
    # Counts: one linearisation per bound+gradient evaluation; one set-up per direction computed (every
    # Newton step but the last, which stops at convergence); one application per CG iteration plus one
    # for the initial residual of each direction.
    directions = max(result["grads"] - 1, 0)
    predicted = (result["grads"] * t_lin + result["hvps"] * t_hvp
                 + directions * t_setup + (result["hvps"] + directions) * t_apply)
    unit = result["eval_seconds"]
    return dict(linearize=t_lin / unit, hvp=t_hvp / unit, precond_setup=t_setup / unit, precond_apply=t_apply / unit,
                directions=directions, predicted_seconds=predicted, predicted_equivalents=predicted / unit,
                share_preconditioner=(directions * t_setup + (result["hvps"] + directions) * t_apply) / predicted,
                share_hvp=result["hvps"] * t_hvp / predicted, share_linearize=result["grads"] * t_lin / predicted)


# -------------------------------------------------------------------------------------------- NumPyro
def run_numpyro(model, data, target, max_steps, chunk=500, lr=1e-2, seed=0):
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal

    X = jnp.asarray(data.X_train)
    y01 = jnp.asarray((data.y_train > 0).astype(np.float64))
    dim = X.shape[1]

    def numpyro_model():
        w = numpyro.sample("w", dist.Normal(jnp.zeros(dim), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y01)

    guide = AutoMultivariateNormal(numpyro_model)
    svi = SVI(numpyro_model, guide, numpyro.optim.Adam(lr), Trace_ELBO(num_particles=1))
    state = svi.init(jax.random.key(seed))

    @jax.jit
    def advance(state):
        return jax.lax.fori_loop(0, chunk, lambda i, s: svi.update(s)[0], state)

    @jax.jit
    def vijax_bound(params):
        posterior = guide.get_posterior(params)  # MultivariateNormal(loc, scale_tril=L), S = L Lᵀ
        # vijax stores S = CᵀC with C upper-triangular, so C = Lᵀ exactly (the same S as
        # vj.covariance.Full().from_dense(L @ L.T), without a second Cholesky).
        factor = vj.covariance.CholeskyFactor.from_matrix(posterior.scale_tril.T)
        return vj.gkl.bound(GaussianParams(posterior.loc, factor), model)

    jax.block_until_ready(advance(state))  # compile (the result is discarded)
    history = [(0, 0.0, float(vijax_bound(svi.get_params(state))))]
    elapsed, steps, reached = 0.0, 0, None
    while steps < max_steps:
        state, (seconds,) = timed(advance, state)
        elapsed += seconds
        steps += chunk
        value = float(vijax_bound(svi.get_params(state)))
        history.append((steps, elapsed, value))
        if value >= target - NAT:
            reached = (steps, elapsed)
            break
    return dict(lr=lr, chunk=chunk, max_steps=max_steps, steps_run=steps, seconds_run=elapsed,
                final_bound=history[-1][2], best_bound=max(h[2] for h in history), history=history,
                reached_within_0p1=reached, seconds_per_step=elapsed / max(steps, 1))


# ----------------------------------------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 250 only, fewer repeats, NumPyro <= 5,000 steps")
    parser.add_argument("--seed", type=int, default=0, help="data seed (and NumPyro's)")
    parser.add_argument("--num-test", type=int, default=10 * DIM, help="test points (default 10 D = 5000)")
    parser.add_argument("--numpyro-steps", type=int, default=None, help="cap on SVI steps (20,000; quick 5,000)")
    parser.add_argument("--no-numpyro", action="store_true")
    args = parser.parse_args(argv)

    sizes = [250] if args.quick else [250, 500, 2500]
    repeats, eval_repeats = (2, 7) if args.quick else (3, 15)
    max_steps = args.numpyro_steps or (5_000 if args.quick else 20_000)
    full = vj.covariance.Full()
    methods = [("natural", vj.GKL()), ("NewtonCG", vj.GKL(covariance=full, solver=vj.solvers.NewtonCG())),
               ("LBFGS", vj.GKL(covariance=full, solver=vj.solvers.LBFGS()))]
    run_start = time.perf_counter()

    print(f"Synthetic logistic regression (Challis thesis §5.2): D = {DIM}, N_test = {args.num_test}, seed {args.seed}, "
          f"prior N(0, I); G-KL, full covariance, default stopping rules.")
    print(f"JAX {jax.__version__} ({jax.devices()[0].platform}, float64), {platform.processor() or platform.machine()}; "
          f"fit time = median of {repeats} calls after compiling; eval/matmul = medians of {eval_repeats}.")
    header = (f"{'N':>5} {'solver':>9} {'iters':>5} {'conv':>4} {'max|g|':>7} {'time s':>7} {'bound/N':>8} "
              f"{'|m-w|/D':>8} {'|m-w|²/D':>8} {'testLL':>7} {'grads':>5} {'hvps':>5} {'vals':>4} "
              f"{'eval ms':>7} {'mm ms':>6} {'ratio':>5} {'equiv':>6} {'Δbound':>8}")
    print("\n" + header + "\n" + "-" * len(header))

    results = []
    for n in sizes:
        data = synthetic_logistic_regression(args.seed, DIM, n, args.num_test)
        model = vj.glm.logistic_regression(data.X_train, data.y_train, prior_variance=1.0)
        row = dict(N=n, vijax=[])
        for label, method in methods:
            r, post = run_vijax(model, data, label, method, repeats, eval_repeats)
            if label == "NewtonCG":
                r["breakdown"] = newton_cg_breakdown(model, post, r, eval_repeats)
            r["bound_difference"] = r["bound"] - (row["vijax"][0]["bound"] if row["vijax"] else r["bound"])
            row["vijax"].append(r)
            print(f"{n:>5} {r['solver']:>9} {r['iterations']:>5} {'yes' if r['converged'] else 'NO':>4} "
                  f"{r['grad_norm']:>7.1e} {r['seconds']:>7.3f} {r['bound_per_n']:>8.4f} {r['w_error']:>8.4f} "
                  f"{r['w_error_sq']:>8.4f} {r['test_ll']:>7.4f} {r['grads']:>5} {r['hvps']:>5} {r['values']:>4} "
                  f"{1e3 * r['eval_seconds']:>7.2f} {1e3 * r['matmul_seconds']:>6.2f} {r['eval_ratio']:>5.2f} "
                  f"{r['equivalents']:>6.1f} {r['bound_difference']:>8.1e}")
        row["Newton"] = "skipped: dense Hessian of D(D+3)/2 = 125,750 parameters has 1.6e10 entries (126 GB)"
        print(f"{n:>5} {'Newton':>9}  skipped: dense Hessian over D(D+3)/2 = 125,750 parameters (126 GB in float64)")
        b = row["vijax"][1]["breakdown"]
        print(f"{'':>5} Newton-CG cost per part, in bound+gradient evaluations: linearize {b['linearize']:.2f}, "
              f"HVP {b['hvp']:.2f}, preconditioner set-up {b['precond_setup']:.2f} (x{b['directions']}), "
              f"apply {b['precond_apply']:.2f} (x{row['vijax'][1]['hvps'] + b['directions']}); predicted "
              f"{b['predicted_equivalents']:.0f} equiv. ({100 * b['share_preconditioner']:.0f}% preconditioner, "
              f"{100 * b['share_hvp']:.0f}% HVPs, {100 * b['share_linearize']:.0f}% linearize)")

        if not args.no_numpyro:
            best = row["vijax"][0]
            try:
                npy = run_numpyro(model, data, best["bound"], max_steps, seed=args.seed)
            except ImportError as error:
                npy = dict(error=f"numpyro import failed: {error}")
            row["numpyro"] = npy
            if "error" in npy:
                print(f"{n:>5}  NumPyro: skipped ({npy['error']})")
            else:
                if npy["reached_within_0p1"]:
                    steps, seconds = npy["reached_within_0p1"]
                    npy["speedup"], npy["speedup_is_lower_bound"] = seconds / best["seconds"], False
                    what = f"within {NAT} nat after {steps} steps, {seconds:.2f} s"
                else:
                    npy["speedup"], npy["speedup_is_lower_bound"] = npy["seconds_run"] / best["seconds"], True
                    what = (f"NOT within {NAT} nat after {npy['steps_run']} steps ({npy['seconds_run']:.2f} s): "
                            f"bound {npy['final_bound']:.2f} (best checkpoint {npy['best_bound']:.2f}) "
                            f"vs vijax {best['bound']:.2f}")
                print(f"{n:>5}  NumPyro SVI (AutoMultivariateNormal, Adam {npy['lr']:g}, 1 particle): {what}; "
                      f"time ratio NumPyro / vijax default {'>' if npy['speedup_is_lower_bound'] else '='} "
                      f"{npy['speedup']:.0f}x")
        print()
        results.append(row)

    print(f"Targets: natural-parameter fit <= {TARGET_NATURAL:g} bound+gradient equivalents with max|grad| < 1e-3 and "
          f"the bound of Newton-CG to {TARGET_AGREEMENT:g}; Newton-CG (full Cholesky) <= {TARGET_EQUIVALENTS:g}; "
          f"evaluation ratio <= {TARGET_RATIO:g}; NumPyro >= {TARGET_SPEEDUP:g}x slower to come within {NAT} nat.")
    for row in results:
        nat, r = row["vijax"][0], row["vijax"][1]
        line = (f"  N = {row['N']:>4}: natural {nat['equivalents']:5.1f} equiv. (max|grad| {nat['grad_norm']:.1e}) "
                f"{verdict(nat['equivalents'] <= TARGET_NATURAL and nat['grad_norm'] < 1e-3)}"
                f" | bound vs Newton-CG {abs(r['bound_difference']):.1e} "
                f"{verdict(abs(r['bound_difference']) <= TARGET_AGREEMENT)}"
                f" | Newton-CG {r['equivalents']:5.1f} equiv. {verdict(r['equivalents'] <= TARGET_EQUIVALENTS)}"
                f" | eval ratio {r['eval_ratio']:.2f} {verdict(r['eval_ratio'] <= TARGET_RATIO)}")
        npy = row.get("numpyro")
        if npy and "speedup" in npy:
            sign = ">" if npy["speedup_is_lower_bound"] else "="
            line += f" | NumPyro/vijax {sign} {npy['speedup']:.0f}x {verdict(npy['speedup'] >= TARGET_SPEEDUP)}"
            if npy["speedup_is_lower_bound"]:
                line += f" (NumPyro never within {NAT} nat in {npy['steps_run']} steps)"
        else:
            line += " | NumPyro: not run"
        print(line)

    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "blr_gkl_quick" if args.quick else "blr_gkl"
    meta = dict(dim=DIM, num_test=args.num_test, seed=args.seed, quick=args.quick, repeats=repeats,
                eval_repeats=eval_repeats, numpyro_max_steps=max_steps, jax=jax.__version__,
                platform=jax.devices()[0].platform,
                targets=dict(natural_equivalents=TARGET_NATURAL, agreement=TARGET_AGREEMENT,
                             equivalents=TARGET_EQUIVALENTS, eval_ratio=TARGET_RATIO, numpyro_speedup=TARGET_SPEEDUP),
                total_seconds=time.perf_counter() - run_start)
    (RESULTS / f"{name}.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    _plot(results, RESULTS / f"{name}.png")
    print(f"\nSaved {RESULTS / (name + '.json')} and {name}.png ({meta['total_seconds']:.0f} s in all)")


def _plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, row in zip(axes[0], results):
        best = row["vijax"][0]["bound_per_n"]
        lowest = best - 0.5
        for r in row["vijax"]:
            trace = np.array(r["trace"])
            t = r["seconds"] * np.arange(len(trace)) / max(len(trace) - 1, 1)
            ax.plot(t, trace / row["N"], marker=".", label=f"vijax {r['solver']} (iterations spread over its time)")
        npy = row.get("numpyro", {})
        if npy.get("history"):
            h = np.array(npy["history"])
            ax.plot(h[:, 1], h[:, 2] / row["N"], marker="x", label="NumPyro SVI: vijax bound at its guide")
            lowest = min(lowest, h[-1, 2] / row["N"] - 0.1)
        ax.axhline(best - NAT / row["N"], color="grey", lw=0.5, ls=":")
        ax.set_ylim(lowest, best + 0.05)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(0, None)
        ax.set_xlabel("seconds (compilation excluded)")
        ax.set_ylabel("G-KL bound / N")
        ax.set_title(f"D = {DIM}, N = {row['N']}")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
