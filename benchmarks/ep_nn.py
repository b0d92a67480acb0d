"""Two-layer networks by EP (Jylänki 2013, Publication IV) against NUTS on the same network and a GP-ARD.

Problems (inputs and targets standardised on the training set):

- ``sim_relevance``: d = 8 inputs x ~ N(0, I); f = sin(1.5 x₁) + 0.5 x₂² + tanh(2 x₃) − 0.5 (strongly
  nonlinear effects of 3 inputs; x₄..x₈ irrelevant); y = f + N(0, 0.2²); n_train = 200, n_test = 1000.
  (The thesis's generators are not given; this one has its stated ingredients: strongly nonlinear
  effects and irrelevant inputs.)
- ``sim_friedman``: d = 10 inputs x ~ U[0, 1]¹⁰, f = 10 sin(π x₁x₂) + 20 (x₃ − ½)² + 10 x₄ + 5 x₅
  (Friedman 1991 #1: an interaction, a quadratic and two linear effects; x₆..x₁₀ irrelevant),
  y = f + N(0, 1); n_train = 200, n_test = 1000.
- ``concrete``: UCI Concrete Compressive Strength (``shared/data/uci/concrete.csv``, 1030 × 8 inputs),
  200 training points drawn at random, the other 830 for testing.
- ``slump``: UCI Concrete Slump (``shared/data/uci/slump_test.data``, 103 × 7 inputs; target: the
  28-day compressive strength), 70 training points, 33 for testing.

Methods:

- ``EP-NN``: `vj.nn.NetworkEP` (damping 0.3, momentum 0.7 with restarts, the prior and scale sites damped
  at 0.6 from iteration 1000, started from a MAP fit, converged when the moment residual is ≤ 1e-3,
  2000 iterations at most) on `vj.nn.TwoLayerNetwork` (K = 8 erf units, ARD input priors, log-normal
  noise prior, half-Gaussian output weights v_k ≥ 0).
- ``NUTS-NN``: NumPyro NUTS on the same network and priors (1 chain, 500 warm-up + 500 draws unless
  ``--nuts-budget``; non-centred input weights).
- ``GP-ARD``: `vj.gp.fit_hyperparameters` (ML-II) of a squared-exponential ARD kernel with a
  Gaussian likelihood (its noise learnt), predictions by `vj.gp.predict`.

Metrics on the test set: RMSE and mean log predictive density (original units), wall time (including
compilation; the machine was shared with other jobs, so times are indicative). Also: the relevances
(EP: E[e^{φ_l}]; NUTS: posterior mean of e^{φ_l}; GP: 1/lengthscale²), and EP's time per iteration
against n (K = 8) and against K (n = 400), which should grow linearly.

Run: ``MPLBACKEND=Agg python benchmarks/ep_nn.py [--quick] [--nuts-max-n N] [--methods EP-NN,...]``
(``--quick``: fewer sizes in the scaling runs; NUTS-NN runs on the problems with at most N training
points, default 250; ``--methods``: rerun only these, keeping the other methods' saved results;
``--problems a,b``: only these problems; ``--nuts-budget W,S``: NUTS warm-up and draws, default 500,500;
``--no-scaling``: skip the timing runs and leave ``ep_nn.txt`` alone, print the table).
Writes ``benchmarks/results/ep_nn.{txt,json}``.

``--convergence PROBLEM``: where EP-NN fails to converge on one problem. One `vj.nn.NetworkEP` fit (its
defaults, or ``--damping``, ``--prior-damping``, ``--momentum``; ``--iterations`` at most, default 2000):
the moment residual every 100 iterations, at the end the residual of each kind of site (activations,
noise, input-weight priors, their scale sites, positivity of v, output weights), the units alive
(E v_k > 0.1), q(v) and the test RMSE / mean log predictive density; with several ``--iterations``
(e.g. ``1500 2000 3000 4000 6000``), one fit stopped at each, to tell a cycle from a drift. Printed only; earlier runs, with per-kind
damping schedules, are in ``benchmarks/results/ep_nn_convergence.txt``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from _common import RESULTS, timed  # noqa: E402

DATA = next((p / "shared" / "data" for p in pathlib.Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()),
            pathlib.Path(__file__).resolve().parents[2] / "shared" / "data")
K = 8


def sim_relevance(rng, n):
    X = rng.normal(size=(n, 8))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + np.tanh(2 * X[:, 2]) - 0.5
    return X, f + 0.2 * rng.normal(size=n)


def sim_friedman(rng, n):
    X = rng.uniform(size=(n, 10))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    return X, f + rng.normal(size=n)


def problems(rng):
    X, y = sim_relevance(rng, 1200)
    yield "sim_relevance", X[:200], y[:200], X[200:], y[200:]
    X, y = sim_friedman(rng, 1200)
    yield "sim_friedman", X[:200], y[:200], X[200:], y[200:]
    path = DATA / "uci" / "concrete.csv"
    if path.exists():
        a = np.loadtxt(path, delimiter=",")
        idx = rng.permutation(len(a))
        yield "concrete", a[idx[:200], :-1], a[idx[:200], -1], a[idx[200:], :-1], a[idx[200:], -1]
    path = DATA / "uci" / "slump_test.data"
    if path.exists():
        a = np.loadtxt(path, delimiter=",", skiprows=1)[:, 1:]  # drop the row number
        X, y = a[:, :7], a[:, 9]
        idx = rng.permutation(len(a))
        yield "slump", X[idx[:70]], y[idx[:70]], X[idx[70:]], y[idx[70:]]


def standardise(Xtr, ytr, Xte, yte):
    mx, sx = Xtr.mean(0), Xtr.std(0)
    my, sy = ytr.mean(), ytr.std()
    return (Xtr - mx) / sx, (ytr - my) / sy, (Xte - mx) / sx, (yte - my) / sy, sy


def metrics(mean, log_dens, yte, sy):
    """RMSE and mean log predictive density in the original units (targets standardised by sy)."""
    return float(np.sqrt(np.mean((mean - yte) ** 2)) * sy), float(np.mean(log_dens) - np.log(sy))


def ep_nn(Xtr, ytr, Xte, yte, key=0):
    t = time.perf_counter()
    net = vj.nn.TwoLayerNetwork(Xtr, ytr, num_hidden=K)
    post = vj.infer(net, vj.nn.NetworkEP(max_iter=2000, tol=1e-3, key=jax.random.PRNGKey(key)))
    mean, _ = post.predict(Xte)
    lp = post.log_predictive(Xte, yte)
    jax.block_until_ready(lp)
    return dict(mean=np.asarray(mean), lp=np.asarray(lp), time=time.perf_counter() - t,
                relevances=np.asarray(post.relevances()).tolist(), iterations=int(post.diagnostics.iterations),
                residual=float(post.diagnostics.stationarity), converged=bool(post.diagnostics.converged),
                alive=int(np.sum(np.asarray(post.v_mean[:-1]) > 0.1)))


NUTS_BUDGET = dict(num_warmup=500, num_samples=500, num_chains=1)  # --nuts-budget WARMUP,SAMPLES


def nuts_nn(Xtr, ytr, Xte, yte, seed=0):
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    d = Xtr.shape[1]

    def model(X, y=None):
        phi0 = numpyro.sample("phi0", dist.Normal(-2.0, 2.0))
        phi = numpyro.sample("phi", dist.Normal(0.0, 2.0).expand([d + 1]))  # inputs, then the bias
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([K, d + 1]))
        W = z * jnp.exp(0.5 * phi)
        v = jnp.concatenate([numpyro.sample("v", dist.HalfNormal(1.0).expand([K])),
                             numpyro.sample("v0", dist.Normal(0.0, 1.0).expand([1]))])
        Xb = jnp.concatenate([X, jnp.ones((X.shape[0], 1))], 1)
        f = jax.scipy.special.erf(Xb @ W.T / np.sqrt(2.0)) @ v[:K] + v[K]
        numpyro.deterministic("f", f)
        numpyro.sample("y", dist.Normal(f, jnp.exp(0.5 * phi0)), obs=y)

    t = time.perf_counter()
    mcmc = MCMC(NUTS(model), progress_bar=False, **NUTS_BUDGET)
    mcmc.run(jax.random.PRNGKey(seed), Xtr, ytr)
    s = mcmc.get_samples()
    pred = numpyro.infer.Predictive(model, s, return_sites=["f"])(jax.random.PRNGKey(1), Xte)["f"]
    sd = np.exp(0.5 * np.asarray(s["phi0"]))[:, None]
    dens = np.exp(-0.5 * ((yte - np.asarray(pred)) / sd) ** 2) / (np.sqrt(2 * np.pi) * sd)
    return dict(mean=np.asarray(pred).mean(0), lp=np.log(dens.mean(0)), time=time.perf_counter() - t,
                relevances=np.exp(np.asarray(s["phi"])[:, :d]).mean(0).tolist(), budget=dict(NUTS_BUDGET),
                divergences=int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"]))))


def gp_ard(Xtr, ytr, Xte, yte):
    t = time.perf_counter()
    d = Xtr.shape[1]
    kernel = vj.gp.kernels.SquaredExponential(lengthscale=np.ones(d), variance=1.0)
    fit = vj.gp.fit_hyperparameters(kernel, jnp.asarray(Xtr), vj.potentials.Gaussian(jnp.asarray(ytr), 0.3),
                                    vj.Laplace(), max_iter=50)
    mean, var = vj.gp.predict(fit.posterior, jnp.asarray(Xte))
    noise = float(fit.likelihood.scale) ** 2
    total = np.asarray(var) + noise
    lp = -0.5 * (np.log(2 * np.pi * total) + (yte - np.asarray(mean)) ** 2 / total)
    return dict(mean=np.asarray(mean), lp=lp, time=time.perf_counter() - t,
                relevances=(1.0 / np.asarray(fit.kernel.lengthscale) ** 2).tolist())


def scaling(quick):
    """EP-NN seconds per iteration against n (K = 8) and K (n = 400): fixed 40 iterations, compiled first."""
    rng = np.random.default_rng(3)
    out = {"n": [], "K": []}
    for label, sizes in (("n", [100, 200, 400, 800] if quick else [100, 200, 400, 800, 1600]),
                         ("K", [2, 4, 8, 16, 32] if quick else [2, 4, 8, 16, 32, 64])):
        for size in sizes:
            n, k = (size, K) if label == "n" else (400, size)
            X, y = sim_relevance(rng, n)
            net = vj.nn.TwoLayerNetwork(X, (y - y.mean()) / y.std(), num_hidden=k)
            # A random start: the MAP start's L-BFGS is not part of an EP iteration's cost.
            method = vj.nn.NetworkEP(max_iter=40, tol=0.0, init="random")
            state = method.start(net)
            jax.block_until_ready(method.fit(net, state))  # compile
            t = time.perf_counter()
            post = jax.block_until_ready(method.fit(net, state))
            out[label].append((size, (time.perf_counter() - t) / max(int(post.diagnostics.iterations), 1)))
    return out


def convergence(args, data):
    """``--convergence``: EP-NN fits of one problem stopped at each of ``--iterations``: the residual trace, each
    kind of site's residual, q(v) and the test metrics (a drift shows as q(v) still moving)."""
    Xtr, ytr, Xte, yte, sy = data[args.convergence]
    defaults = vj.nn.NetworkEP()
    net = vj.nn.TwoLayerNetwork(Xtr, ytr, num_hidden=K)
    np.set_printoptions(precision=4, linewidth=150)
    for iterations in args.iterations:
        method = vj.nn.NetworkEP(
            damping=defaults.damping if args.damping is None else args.damping,
            prior_damping=(defaults.prior_damping if args.prior_damping is None
                           else None if args.prior_damping.lower() == "none" else float(args.prior_damping)),
            momentum=defaults.momentum if args.momentum is None else args.momentum, max_iter=iterations)
        print(f"{args.convergence} (n = {len(ytr)}, d = {Xtr.shape[1]}), K = {K}: {method}", flush=True)
        post, (seconds,) = timed(lambda: vj.infer(net, method))
        d = post.diagnostics
        trace = np.asarray(d.info.residual_trace)
        if len(args.iterations) == 1:
            for k in range(100, int(d.iterations) + 1, 100):
                print(f"  iteration {k:5d}: residual {trace[k]:.3g}")
        mean, _ = post.predict(Xte)
        rmse, lpd = metrics(np.asarray(mean), np.asarray(post.log_predictive(Xte, yte)), yte, sy)
        last = trace[max(1, int(d.iterations) - 499):int(d.iterations) + 1]
        print(f"stopped at iteration {int(d.iterations)} ({seconds:.0f} s, compilation included), residual "
              f"{float(d.stationarity):.3g} (last 500: {last.min():.3g} to {last.max():.3g}), converged "
              f"{bool(d.converged)}; per kind [h activations, p noise, w input-weight priors, s scales, pos positivity, "
              f"v outputs] {' '.join(f'{r:.2e}' for r in np.asarray(d.info.residuals))}; units alive "
              f"{int(np.sum(np.asarray(post.v_mean[:-1]) > 0.1))}/{K}; test RMSE {rmse:.4f}, LPD {lpd:.4f}\n"
              f"  E v (v_0 last) {np.asarray(post.v_mean)}\n  sd v {np.sqrt(np.diag(np.asarray(post.v_cov)))}",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes in the scaling runs")
    parser.add_argument("--nuts-max-n", type=int, default=250, help="NUTS-NN on problems with at most N training points")
    parser.add_argument("--methods", default=None, help="rerun only these (EP-NN,GP-ARD,NUTS-NN), keep the others")
    parser.add_argument("--problems", default=None, help="only these problems (comma-separated)")
    parser.add_argument("--nuts-budget", default="500,500", help="NUTS warm-up and draws, W,S")
    parser.add_argument("--no-scaling", action="store_true", help="skip the timing runs, leave ep_nn.txt alone")
    parser.add_argument("--convergence", default=None, metavar="PROBLEM", help="EP-NN's convergence on one problem")
    parser.add_argument("--iterations", type=int, nargs="+", default=[2000],
                        help="--convergence: iterations at most (several: one fit stopped at each)")
    parser.add_argument("--damping", type=float, default=None, help="--convergence: NetworkEP's damping")
    parser.add_argument("--prior-damping", default=None, help="--convergence: NetworkEP's prior_damping (or none)")
    parser.add_argument("--momentum", type=float, default=None, help="--convergence: NetworkEP's momentum")
    args = parser.parse_args()
    quick, nuts_max_n = args.quick, args.nuts_max_n
    only = args.methods.split(",") if args.methods else None
    names = args.problems.split(",") if args.problems else None
    warmup, samples = args.nuts_budget.split(",")
    NUTS_BUDGET.update(num_warmup=int(warmup), num_samples=int(samples))
    rng = np.random.default_rng(0)
    rows, record = [], {}
    data = {name: standardise(*split) for name, *split in problems(rng)}
    if args.convergence:
        return convergence(args, data)
    saved_scaling = None
    if only and (RESULTS / "ep_nn.json").exists():  # rerun some methods, keep the others' results
        record = json.loads((RESULTS / "ep_nn.json").read_text())
        saved_scaling = record.pop("scaling", None)
    ntrain = {name: len(d[1]) for name, d in data.items()}
    runs = [(name, label, method) for label, method in (("EP-NN", ep_nn), ("GP-ARD", gp_ard)) for name in data]
    runs += [(name, "NUTS-NN", nuts_nn) for name in data if ntrain[name] <= nuts_max_n]
    runs = [r for r in runs if (only is None or r[1] in only) and (names is None or r[0] in names)]
    for name, label, method in sorted(runs, key=lambda r: (r[2] is nuts_nn, ntrain[r[0]] if r[2] is nuts_nn else 0)):
        Xtr_s, ytr_s, Xte_s, yte_s, sy = data[name]
        r = method(Xtr_s, ytr_s, Xte_s, yte_s)
        rmse, lpd = metrics(r["mean"], r["lp"], yte_s, sy)
        extra = {k: r[k] for k in ("iterations", "residual", "converged", "alive", "budget", "divergences") if k in r}
        record.setdefault(name, {})[label] = dict(rmse=rmse, lpd=lpd, time=r["time"], relevances=r["relevances"], **extra)
        print(name, label, record[name][label], flush=True)
        RESULTS.mkdir(exist_ok=True)  # keep what is done, in case a long run is stopped
        (RESULTS / "ep_nn.json").write_text(json.dumps(dict(record, **({"scaling": saved_scaling} if saved_scaling else {})), indent=1))
    for name, methods in record.items():
        for label, r in methods.items():
            rows.append(f"{name:14s} {label:8s} {r['rmse']:10.4f} {r['lpd']:10.4f} {r['time']:9.1f}  "
                        + ("" if "iterations" not in r else f"iters {r['iterations']}, residual {r['residual']:.3g}, "
                           f"units alive (E v_k > 0.1) {r['alive']}/{K}"))
    lines = ["problem        method         RMSE   mean LPD   time (s)", *rows, ""]
    for name, relevant in (("sim_relevance", 3), ("sim_friedman", 5)):
        d = data[name][0].shape[1]
        lines.append(f"relevances ({name}: inputs 1-{relevant} relevant, {relevant + 1}-{d} irrelevant):")
        for label, r in record.get(name, {}).items():
            rel = np.asarray(r["relevances"])
            last = set(np.argsort(-rel)[relevant:].tolist()) == set(range(relevant, d))
            lines.append(f"  {label:8s} " + " ".join(f"{v:8.3g}" for v in rel) + f"   irrelevant ranked last: {last}")
    RESULTS.mkdir(exist_ok=True)
    if args.no_scaling:
        print("\n".join(lines))
        return
    (RESULTS / "ep_nn.txt").write_text("\n".join(lines) + "\n(scaling runs pending)\n")
    sc = scaling(quick)
    record["scaling"] = sc
    lines.append("")
    lines.append("EP-NN seconds per iteration (shared machine; indicative):")
    lines.append("  vs n (K = 8): " + ", ".join(f"n={n}: {t:.4f}" for n, t in sc["n"]))
    lines.append("  vs K (n = 400): " + ", ".join(f"K={k}: {t:.4f}" for k, t in sc["K"]))
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ep_nn.txt").write_text(text + "\n")
    (RESULTS / "ep_nn.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
