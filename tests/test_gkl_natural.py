"""The default full-covariance G-KL: natural-parameter ascent over (m, λ), S⁻¹ = Λ + Hᵀdiag(λ)H.

Oracles: the bound's optimality conditions checked in NumPy (`helpers.gkl_optimality`: independent of the
algorithm, the parametrisation and vijax's quadrature), and the closed-form posterior of conjugate models
(`helpers.gaussian_posterior`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse

import vijax as vj
from vijax import potentials as P
from vijax.methods import _gkl_natural
from vijax.projections import ScaledIdentity
from vijax.quadrature import GaussHermite

from helpers import gaussian_posterior, gkl_optimality, glm_site_functions



def _labels(rng, X):
    w = rng.normal(size=X.shape[1])
    return np.where(rng.uniform(size=X.shape[0]) < 1 / (1 + np.exp(-X @ w)), 1.0, -1.0)


def _case(name, rng):
    """(model, expected form): N > D takes the primal form, N ≤ D with a diagonal Λ the dual."""
    if name == "dense-primal":
        X = rng.normal(size=(60, 6)) * np.array([1.0, 10.0, 0.1, 1.0, 3.0, 1.0])
        return vj.glm.logistic_regression(X, (_labels(rng, X) > 0).astype(float), prior_variance=4.0), "primal"
    if name == "dense-dual":
        X = rng.normal(size=(12, 30))
        return vj.glm.probit_regression(X, (_labels(rng, X) > 0).astype(float), prior_variance=2.0), "dual"
    if name == "sparse-primal":
        X = rng.normal(size=(80, 10)) * (rng.uniform(size=(80, 10)) < 0.3)
        H = sparse.BCOO.fromdense(_labels(rng, X)[:, None] * X)
        return vj.LatentLinearModel(vj.GaussianFactor.diagonal(np.linspace(0.5, 2.0, 10)),
                                    vj.Sites(H, P.Logistic())), "primal"
    if name == "groups-primal":  # logistic likelihood and Laplace prior sites on every coefficient
        X = rng.normal(size=(40, 8))
        return vj.LatentLinearModel(vj.GaussianFactor.isotropic(8, 10.0),
                                    (vj.Sites(_labels(rng, X)[:, None] * X, P.Logistic()),
                                     vj.Sites(vj.Identity(8), P.Laplace(0.0, 0.3)))), "primal"
    if name == "groups-dual":
        X = rng.normal(size=(6, 25))
        return vj.LatentLinearModel(vj.GaussianFactor.diagonal(np.linspace(0.5, 3.0, 25)),
                                    (vj.Sites(_labels(rng, X)[:, None] * X, P.Logistic()),
                                     vj.Sites(2.0 * X[:4], P.Probit()))), "dual"
    if name == "poisson-dense-prior":  # a dense prior, whitened, with N > D
        X = np.stack([np.ones(30), np.linspace(-1, 1, 30), np.linspace(-1, 1, 30) ** 2], axis=1)
        counts = rng.poisson(np.exp(1.0 + X[:, 1]))
        cov = np.array([[4.0, 1.0, 0.5], [1.0, 2.0, 0.3], [0.5, 0.3, 1.0]])
        return vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(3), cov),
                                    vj.Sites(X, P.Poisson(counts))), "primal"
    raise ValueError(name)


def _numpy_groups(model):
    """The model's site groups as (dense H, `helpers.glm_site_functions`), for `helpers.gkl_optimality`."""
    groups = []
    for g in model.sites:
        assert not np.any(np.asarray(g.offset))
        p = g.potential
        fn = {P.Logistic: lambda: glm_site_functions("logistic"), P.Probit: lambda: glm_site_functions("probit"),
              P.Poisson: lambda: glm_site_functions("poisson", p.counts),
              P.Laplace: lambda: glm_site_functions("laplace", loc=float(p.loc), scale=float(p.scale))}[type(p)]()
        groups.append((np.asarray(_dense(g.projection, model.dim, model.dtype)), fn))
    return groups


@eqx.filter_jit
def _dense(projection, dim, dtype):
    return projection.mv(jnp.eye(dim, dtype=dtype))


@eqx.filter_jit
def _bound_and_implied_precision(post, model):
    """The bound at q and Λ + Σ_g H_gᵀ diag(λ_g) H_g, with λ in ``post.state``: one program."""
    implied = sum(g.projection.gram(lam) for g, lam in zip(model.sites, post.state.precision))
    if model.prior is not None:
        implied = implied + model.prior.precision_matrix()
    return vj.gkl.bound_at(post, model), implied


CASES = ["dense-primal", "dense-dual", "sparse-primal", "groups-primal", "groups-dual", "poisson-dense-prior"]


@pytest.mark.parametrize("name", CASES)
def test_reaches_the_optimum_of_the_bound_and_rises_every_step(rng, name):
    model, form = _case(name, rng)
    post = vj.infer(model, vj.GKL())
    d = post.diagnostics
    assert d.solver == f"natural-parameter ascent ({form})" and bool(d.converged)
    # The bound's optimality conditions in (m, S), in NumPy: the mean a natural-gradient step of less than
    # 1e-7 posterior sds from the optimum's, S⁻¹ = Λ − Σ_g H_gᵀ diag⟨(log φ)''⟩ H_g to 1e-7 relative.
    step, error = gkl_optimality(post.mean, post.covariance, _numpy_groups(model),
                                 model.prior.precision_matrix(), model.initial_moments()[0])
    assert step < 1e-7 and error < 1e-7, (step, error)
    # The bound never decreases (beyond its rounding), and log Z is the bound at the q returned.
    trace = np.asarray(d.objective_trace)[: int(d.iterations) + 1]
    assert np.all(np.diff(trace) >= -1e-10 * np.abs(trace[1:])), trace
    bound, implied = _bound_and_implied_precision(post, model)
    np.testing.assert_allclose(post.log_z, bound, rtol=1e-13)
    # At the optimum S⁻¹ = Λ + Σ_g H_gᵀ diag(λ_g) H_g, with λ in post.state.
    precision = np.linalg.inv(np.asarray(post.covariance))
    np.testing.assert_allclose(precision, implied, rtol=1e-7, atol=1e-8 * np.abs(implied).max())


@pytest.mark.parametrize("shape", [(40, 5), (5, 40)], ids=["primal", "dual"])
def test_exact_on_conjugate_models_in_one_step(rng, shape):
    X = rng.normal(size=shape)
    y = X @ rng.normal(size=shape[1]) + 0.3 * rng.normal(size=shape[0])
    prior_var = np.linspace(0.5, 2.0, shape[1])
    model = vj.LatentLinearModel(vj.GaussianFactor.diagonal(prior_var), vj.Sites(X, P.Gaussian(loc=y, scale=0.3)))
    mean, cov, log_z = gaussian_posterior(np.zeros(shape[1]), np.diag(prior_var), X, y, 0.09)
    post = vj.infer(model, vj.GKL())
    assert int(post.diagnostics.iterations) <= 2
    np.testing.assert_allclose(post.mean, mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(post.covariance, cov, rtol=0, atol=1e-10)
    np.testing.assert_allclose(post.log_z, log_z, rtol=1e-12)


def test_warm_and_cold_starts_take_the_same_path_to_the_same_answer(rng):
    model, _ = _case("groups-dual", rng)
    model = vj.LatentLinearModel(model.prior, model.sites[0])  # logistic sites: LVB applies
    cold = vj.infer(model, vj.GKL())
    for init in (cold, vj.infer(model, vj.Laplace()), vj.infer(model, vj.LVB())):
        warm = vj.infer(model, vj.GKL(), init=init)
        assert warm.diagnostics.solver == cold.diagnostics.solver
        np.testing.assert_allclose(warm.log_z, cold.log_z, rtol=1e-12)
        np.testing.assert_allclose(warm.mean, cold.mean, rtol=0, atol=1e-8)
        np.testing.assert_allclose(warm.covariance, cold.covariance, rtol=0, atol=1e-8)
    assert int(vj.infer(model, vj.GKL(), init=cold).diagnostics.iterations) <= 1  # from its own λ


def test_float32_reaches_float32_resolution(rng):
    X = rng.normal(size=(60, 6)) * np.array([1.0, 10.0, 0.1, 1.0, 3.0, 1.0])
    y = (_labels(rng, X) > 0).astype(float)
    ref = vj.infer(vj.glm.logistic_regression(X, y, prior_variance=4.0), vj.GKL())
    post = vj.infer(vj.glm.logistic_regression(X.astype(np.float32), y.astype(np.float32), prior_variance=4.0),
                    vj.GKL())
    assert post.mean.dtype == jnp.float32 and bool(post.diagnostics.converged)
    np.testing.assert_allclose(post.log_z, ref.log_z, rtol=1e-5)
    np.testing.assert_allclose(post.mean, ref.mean, rtol=0, atol=1e-3)


@pytest.mark.parametrize("dim", [32, 33, 48])
def test_newton_steps_converge_quadratically_at_every_dimension(rng, dim):
    """The primal form's Newton step has Σ∘Σ in full at every D (its products, never the matrix): as
    many iterations above D = 32 as below (with Σ∘Σ by its diagonal it took 11 or more), to a point where
    ∇_m B = 0 and λ = λ* to working precision."""
    X = rng.normal(size=(200, dim)) * np.linspace(0.3, 3.0, dim)
    post = vj.infer(vj.glm.logistic_regression(X, (_labels(rng, X) > 0).astype(float)), vj.GKL())
    d = post.diagnostics
    assert d.solver == "natural-parameter ascent (primal)" and bool(d.converged)
    assert int(d.iterations) <= 7 and int(d.num_value_evals) <= int(d.iterations) + 1
    assert float(d.grad_norm) < 1e-10


def test_tol_may_be_traced(rng):
    """``tol`` is a setting, so it may arrive as a traced scalar; from a cold start (m = 0, λ = 1)."""
    for name in ("dense-primal", "dense-dual"):
        model, form = _case(name, rng)
        n = sum(g.num_sites for g in model.sites)
        fit = jax.jit(lambda m, tol: _gkl_natural.fit(m, m, jnp.zeros(m.dim), (jnp.ones(n),), GaussHermite(), 100, tol))
        ref = vj.infer(model, vj.GKL())
        for tol in (1e-10, 1e-4):
            out = fit(model, jnp.asarray(tol))
            assert bool(out.diagnostics.converged) and out.diagnostics.solver == f"natural-parameter ascent ({form})"
            np.testing.assert_allclose(out.value, ref.log_z, rtol=1e-12 if tol < 1e-6 else 1e-6)


def test_float32_dual_form_on_a_gp(rng):
    """A GP classifier in float32 (dense prior, H = diag(labels); dual form): its bound used to be float64
    there, which made the fit stop at once with log Z = 0."""
    x = np.linspace(-3, 3, 30)
    K = np.exp(-0.5 * (x[:, None] - x[None]) ** 2) + 1e-6 * np.eye(30)
    labels = np.where(np.sin(2 * x) + 0.3 * rng.normal(size=30) > 0, 1.0, -1.0)
    fits = [vj.infer(vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(30, dt), K.astype(dt)),
                                          vj.Sites(ScaledIdentity(labels.astype(dt)), P.Logistic())),
                     vj.GKL()) for dt in (np.float32, np.float64)]  # float32 first: it failed only so
    assert fits[0].mean.dtype == jnp.float32 and fits[0].diagnostics.solver == "natural-parameter ascent (dual)"
    assert bool(fits[0].diagnostics.converged) and int(fits[0].diagnostics.iterations) > 0
    np.testing.assert_allclose(fits[0].log_z, fits[1].log_z, rtol=1e-5)
    np.testing.assert_allclose(fits[0].mean, fits[1].mean, rtol=0, atol=1e-3)
