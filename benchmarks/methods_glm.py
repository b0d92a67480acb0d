"""Every Gaussian method of vijax on three models, against a long NUTS run (NumPyro) as ground truth.

A benchmark script, not a test. Problems:

- ``logistic``: breast-cancer logistic regression (scikit-learn's copy; standardised features and an
  intercept, D = 31, 398 training / 171 test points), prior N(0, I);
- ``poisson``: Poisson regression of doctor visits (``mdvis``) on the nine covariates of the RAND
  health-insurance data bundled with statsmodels (standardised, with an intercept, D = 10; 2,000
  training and 2,000 test rows drawn at random from the 20,190), prior N(0, I);
- ``sparse``: the sparse linear model of Challis's thesis §5.4 (demo 2): a Laplace prior with unit
  variance (τ = 1/√2) on every weight, Gaussian likelihood with noise variance 0.01,
  X ~ N(0, 1) entries, w_true with three quarters of its D = 512 entries zero; N = 256 training and
  500 test measurements. No Gaussian prior term: the Laplace sites sit on ``vj.Identity(D)``.

Methods: G-KL with a full Cholesky (Newton-CG), mean field (G-KL diagonal), Laplace, MAP, and LVB
(Jaakkola and Böhning bounds for the logistic sites, the scale-mixture bound for Laplace sites; LVB
has no bound for Poisson sites). Per method the table gives log Z (``bound`` where it is a guaranteed
lower bound, ``approx.`` otherwise, ``log joint`` for MAP), KL(N(m_nuts, S_nuts) ‖ q) from the NUTS
mean and covariance, the relative error of the mean ‖m − m_nuts‖/‖m_nuts‖, the test log-likelihood per
point (the model's predictive density under q), iterations, converged, and the fit time (compilation
excluded). The NUTS row gives its own test log-likelihood (Monte Carlo predictive) and run time.

Run (float64 is switched on by this script)::

    python benchmarks/methods_glm.py            # NUTS: 1 chain, 2,000 warm-up + 10,000 draws
    python benchmarks/methods_glm.py --quick    # 500 + 2,000 draws
    python benchmarks/methods_glm.py --problems logistic poisson

Writes ``benchmarks/results/methods_glm[_quick].json`` and a plot of KL and test log-likelihood per method
(``.png``; ``--plot-only`` redraws it from the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import platform

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

import vijax as vj

from _common import RESULTS, timed

SPARSE = dict(dim=512, num_train=256, num_test=500, zero_fraction=0.75, noise_variance=0.01, tau=1 / math.sqrt(2))


# ------------------------------------------------------------------------------------------ data
def logistic_problem():
    from vijax.demo import load_data

    X, y, X_test, y_test = load_data()
    model = vj.glm.logistic_regression(X, y, prior_variance=1.0)

    def numpyro_model(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    def test_ll_of_q(post):
        return float(np.mean(vj.glm.log_predictive(post, X_test, y_test)))

    def test_ll_of_samples(W):
        logits = W @ X_test.T  # (S, N)
        ll = jax.nn.log_sigmoid(jnp.where(y_test > 0, logits, -logits))
        return float(jnp.mean(logsumexp(ll, axis=0) - math.log(W.shape[0])))

    return model, (numpyro_model, (X, y)), test_ll_of_q, test_ll_of_samples


def poisson_problem(num_train=2000, num_test=2000, seed=0):
    import statsmodels.api as sm

    data = sm.datasets.randhie.load_pandas().data
    counts = data["mdvis"].to_numpy(float)
    features = data.drop(columns="mdvis").to_numpy(float)
    rows = np.random.default_rng(seed).permutation(len(counts))[: num_train + num_test]
    train, test = rows[:num_train], rows[num_train:]
    mu, sd = features[train].mean(0), features[train].std(0)
    Z = np.hstack([(features - mu) / sd, np.ones((len(counts), 1))])
    X, y, X_test, y_test = Z[train], counts[train], Z[test], counts[test]
    model = vj.glm.poisson_regression(X, y, prior_variance=1.0)

    def numpyro_model(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Poisson(jnp.exp(X @ w)), obs=y)

    def test_ll_of_q(post):
        return float(np.mean(vj.glm.log_predictive(post, X_test, y_test)))

    def test_ll_of_samples(W):
        from jax.scipy.stats import poisson

        ll = poisson.logpmf(y_test[None, :], jnp.exp(W @ X_test.T))
        return float(jnp.mean(logsumexp(ll, axis=0) - math.log(W.shape[0])))

    return model, (numpyro_model, (X, y)), test_ll_of_q, test_ll_of_samples


def sparse_problem(seed=0):
    s = SPARSE
    rng = np.random.default_rng(seed)
    dim, n, n_test = s["dim"], s["num_train"], s["num_test"]
    w_true = rng.normal(size=dim)
    w_true[rng.permutation(dim)[: int(s["zero_fraction"] * dim)]] = 0.0
    X_all = rng.normal(size=(n + n_test, dim))
    y_all = X_all @ w_true + math.sqrt(s["noise_variance"]) * rng.normal(size=n + n_test)
    X, y, X_test, y_test = X_all[:n], y_all[:n], X_all[n:], y_all[n:]
    noise_scale = math.sqrt(s["noise_variance"])
    model = vj.LatentLinearModel(None, (
        vj.Sites(X, vj.potentials.Gaussian(loc=y, scale=noise_scale)),
        vj.Sites(vj.Identity(dim), vj.potentials.Laplace(loc=0.0, scale=s["tau"])),
    ))

    def numpyro_model(X, y=None):
        import numpyro
        import numpyro.distributions as dist

        w = numpyro.sample("w", dist.Laplace(0.0, s["tau"]).expand([X.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Normal(X @ w, noise_scale), obs=y)

    def test_ll_of_q(post):
        mean, var = post.marginals(X_test)
        var = var + s["noise_variance"]
        return float(np.mean(-0.5 * (np.log(2 * np.pi * var) + (y_test - mean) ** 2 / var)))

    def test_ll_of_samples(W):
        var = s["noise_variance"]
        ll = -0.5 * (jnp.log(2 * jnp.pi * var) + (y_test[None, :] - W @ X_test.T) ** 2 / var)
        return float(jnp.mean(logsumexp(ll, axis=0) - math.log(W.shape[0])))

    return model, (numpyro_model, (X, y)), test_ll_of_q, test_ll_of_samples


PROBLEMS = {"logistic": logistic_problem, "poisson": poisson_problem, "sparse": sparse_problem}


# -------------------------------------------------------------------------------------- methods
def methods(problem):
    # Each method with its default solver (Newton-CG to max|grad| < 1e-3).
    out = {"G-KL full": vj.GKL(), "mean field": vj.MeanField(), "Laplace": vj.Laplace(), "MAP": vj.MAP()}
    if problem == "logistic":
        out["LVB Jaakkola"] = vj.LVB(bound="jaakkola")
        out["LVB Böhning"] = vj.LVB(bound="bohning")
    elif problem == "sparse":
        out["LVB scale mixture"] = vj.LVB()
    return out


def gaussian_kl(m0, S0, m1, S1):
    """KL(N(m0, S0) ‖ N(m1, S1))."""
    L1 = np.linalg.cholesky(S1)
    solve = lambda B: np.linalg.solve(L1.T, np.linalg.solve(L1, B))
    d = m1 - m0
    logdet0 = np.linalg.slogdet(S0)[1]
    logdet1 = 2 * np.sum(np.log(np.diag(L1)))
    return 0.5 * (np.trace(solve(S0)) + d @ solve(d) - len(m0) + logdet1 - logdet0)


def run_nuts(numpyro_model, args, num_warmup, num_samples, seed=0):
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(NUTS(numpyro_model), num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    def sample():
        mcmc.run(jax.random.key(seed), *args)
        return np.asarray(mcmc.get_samples()["w"])

    W, (seconds,) = timed(sample)
    return W, seconds


def fit(model, method):
    run = jax.jit(lambda m: vj.infer(m, method))
    compiled, (compile_seconds,) = timed(lambda: run.lower(model).compile())
    post, (seconds,) = timed(compiled, model)
    return post, seconds, compile_seconds


def evaluate(problem, num_warmup, num_samples):
    model, (numpyro_model, args), test_ll_of_q, test_ll_of_samples = PROBLEMS[problem]()
    W, nuts_seconds = run_nuts(numpyro_model, args, num_warmup, num_samples)
    m_ref, S_ref = W.mean(0), np.cov(W.T)
    rows = [dict(problem=problem, method="NUTS", log_z=None, kind="", kl=0.0, mean_error=0.0,
                 test_ll=test_ll_of_samples(jnp.asarray(W)), iterations=num_warmup + num_samples,
                 converged=True, seconds=nuts_seconds, compile_seconds=None)]
    for name, method in methods(problem).items():
        try:
            post, seconds, compile_seconds = fit(model, method)
        except ValueError as error:  # e.g. a method without a bound for these sites
            rows.append(dict(problem=problem, method=name, error=str(error)))
            continue
        m, S = np.asarray(post.mean), np.asarray(post.covariance)
        kind = "bound" if post.is_lower_bound else ("log joint" if name == "MAP" else "approx.")
        rows.append(dict(
            problem=problem, method=name, log_z=float(post.log_z), kind=kind,
            kl=float(gaussian_kl(m_ref, S_ref, m, S)),
            mean_error=float(np.linalg.norm(m - m_ref) / np.linalg.norm(m_ref)),
            test_ll=test_ll_of_q(post), iterations=int(post.diagnostics.iterations),
            converged=bool(post.diagnostics.converged), seconds=seconds, compile_seconds=compile_seconds,
            fallback=bool(getattr(post.diagnostics.info, "fallback", False))))
    return rows


def print_table(rows):
    problem = rows[0]["problem"]
    print(f"\n{problem}")
    header = (f"  {'method':<18} {'log Z':>11} {'':<9} {'KL(nuts‖q)':>11} {'|m-m*|/|m*|':>11} "
              f"{'test LL/pt':>10} {'iters':>6} {'conv':>5} {'time s':>8}")
    print(header + "\n  " + "-" * (len(header) - 2))
    for r in rows:
        if "error" in r:
            print(f"  {r['method']:<18} n/a: {r['error'][:90]}")
            continue
        log_z = "" if r["log_z"] is None else f"{r['log_z']:.3f}"
        flag = " (Gauss–Newton)" if r.get("fallback") else ""
        print(f"  {r['method']:<18} {log_z:>11} {r['kind']:<9} {r['kl']:>11.4f} {r['mean_error']:>11.4f} "
              f"{r['test_ll']:>10.4f} {r['iterations']:>6} {str(r['converged']):>5} {r['seconds']:>8.3f}{flag}")


def plot(rows, path):
    """One row of panels per problem: KL to NUTS and test log-likelihood per method (`vj.plot.compare`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = list(dict.fromkeys(r["problem"] for r in rows))
    fig, axes = plt.subplots(len(problems), 2, figsize=(11, 2.6 * len(problems)), squeeze=False)
    for (kl_ax, ll_ax), problem in zip(axes, problems):
        fitted = [r for r in rows if r["problem"] == problem and r["kl"] is not None and r["method"] != "NUTS"
                  and math.isfinite(r["kl"])]
        vj.plot.compare({r["method"]: math.log10(max(r["kl"], 1e-12)) for r in fitted}, ax=kl_ax,
                        xlabel="log10 KL(NUTS ‖ q)")
        vj.plot.compare({r["method"]: r["test_ll"] for r in rows if r["problem"] == problem
                         and r["test_ll"] is not None and math.isfinite(r["test_ll"])}, ax=ll_ax,
                        xlabel="test log-likelihood / point")
        kl_ax.set_title(problem, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter NUTS run")
    parser.add_argument("--problems", nargs="+", choices=sorted(PROBLEMS), default=list(PROBLEMS))
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved JSON")
    args = parser.parse_args()
    name = f"methods_glm{'_quick' if args.quick else ''}"
    if args.plot_only:
        plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")
        return
    num_warmup, num_samples = (500, 2000) if args.quick else (2000, 10000)
    print(f"vijax {vj.__version__}, jax {jax.__version__}, {platform.processor() or platform.machine()}; "
          f"NUTS: 1 chain, {num_warmup} warm-up + {num_samples} draws")
    everything = []
    for problem in args.problems:
        rows = evaluate(problem, num_warmup, num_samples)
        print_table(rows)
        everything += rows
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(everything, indent=1))
    plot(everything, RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
