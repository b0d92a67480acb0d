"""Covariance families: every structured quantity equals the dense computation on the same S."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse
from jax.flatten_util import ravel_pytree

import vijax as vj
from vijax.methods.gkl import GaussianParams

D = 7
cov = vj.covariance


def _families(rng):
    mask = np.triu(rng.random((D, D)) < 0.35)
    return {
        "full": cov.Full(),
        "diagonal": cov.Diagonal(),
        "banded": cov.Banded(3),
        "chevron": cov.Chevron(2),
        "sparse_mask": cov.SparseMask(mask),
        "subspace": cov.Subspace(3),
        "factor_analysis": cov.FactorAnalysis(2),
    }


FAMILIES = ["full", "diagonal", "banded", "chevron", "sparse_mask", "subspace", "factor_analysis"]
CONCAVE = ["full", "diagonal", "banded", "chevron", "sparse_mask", "subspace"]


def _random_factor(family, rng):
    """A generic point of the family: its initial factor with every trainable leaf perturbed."""
    factor = family.init(D, rng.uniform(0.5, 1.5, size=D))
    if isinstance(factor, cov.SubspaceFactor):
        basis = np.linalg.qr(rng.normal(size=(D, factor.rank)))[0]
        factor = cov.SubspaceFactor(jnp.asarray(basis), factor.chol, factor.scale)
    free, fixed = eqx.partition(factor, factor.trainable())
    flat, unravel = ravel_pytree(free)
    flat = flat + 0.3 * rng.normal(size=flat.shape)
    return eqx.combine(unravel(flat), fixed)


def _site_matrix(rng, n=11):
    H = rng.normal(size=(n, D))
    H[rng.random(H.shape) < 0.3] = 0.0
    return H


def _priors(rng):
    A = rng.normal(size=(D, D))
    dense_cov = A @ A.T / D + 0.5 * np.eye(D)
    return {
        "isotropic": (vj.GaussianFactor.isotropic(D, 2.0), np.eye(D) / 2.0),
        "diagonal": (vj.GaussianFactor.diagonal(rng.uniform(0.5, 2, D)), None),
        "dense": (vj.GaussianFactor.dense(np.zeros(D), dense_cov), np.linalg.inv(dense_cov)),
        "precision": (vj.GaussianFactor.precision(np.zeros(D), np.linalg.inv(dense_cov)), np.linalg.inv(dense_cov)),
    }


@eqx.filter_jit
def _structured_quantities(factor, projections, priors):
    """Everything a factor computes from its structure, in one program."""
    return dict(dense=factor.dense(), projected=[factor.projected_variances(p) for p in projections],
                identity=factor.projected_variances(vj.Identity(D)), variances=factor.variances(),
                logdet=factor.logdet(), traces=[factor.trace_precision(prior) for prior in priors],
                precisions=[prior.precision_matrix() for prior in priors], cholesky=factor.cholesky(),
                canonical=factor.canonical().dense())


@pytest.mark.parametrize("name", FAMILIES)
def test_structured_quantities_equal_dense(rng, name):
    factor = _random_factor(_families(rng)[name], rng)
    H = _site_matrix(rng)
    priors = _priors(rng).values()
    got = _structured_quantities(factor, [vj.projections.as_projection(p) for p in (H, jsparse.BCOO.fromdense(H))],
                                 [prior for prior, _ in priors])
    S = np.asarray(got["dense"])
    np.testing.assert_allclose(S, S.T, atol=1e-12)
    assert np.linalg.eigvalsh(S).min() > 0
    expected = np.einsum("nd,de,ne->n", H, S, H)
    for projected in got["projected"]:
        np.testing.assert_allclose(projected, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["identity"], np.diag(S), rtol=1e-10)
    np.testing.assert_allclose(got["variances"], np.diag(S), rtol=1e-10)
    np.testing.assert_allclose(got["logdet"], np.linalg.slogdet(S)[1], rtol=1e-10)
    for (_, prec), computed, trace in zip(priors, got["precisions"], got["traces"]):
        prec = np.asarray(computed) if prec is None else prec
        np.testing.assert_allclose(trace, np.trace(prec @ S), rtol=1e-10)
    C = np.asarray(got["cholesky"])
    np.testing.assert_allclose(C.T @ C, S, atol=1e-10)
    np.testing.assert_allclose(got["canonical"], S, atol=1e-12)


@pytest.mark.parametrize("name", FAMILIES)
def test_bound_equals_full_cholesky_bound_on_same_S(rng, name):
    """The G-KL bound depends on the factor only through S."""
    factor = _random_factor(_families(rng)[name], rng)
    H = _site_matrix(rng, 25)
    y = np.where(rng.random(25) < 0.5, -1.0, 1.0)
    model = vj.LatentLinearModel(_priors(rng)["dense"][0], vj.Sites(H * y[:, None], vj.potentials.Logistic()))
    m = rng.normal(size=D)
    got = vj.gkl.bound(GaussianParams(jnp.asarray(m), factor), model)
    expected = vj.gkl.bound(GaussianParams(jnp.asarray(m), cov.Full().from_dense(factor.dense())), model)
    np.testing.assert_allclose(got, expected, rtol=1e-10)


@pytest.mark.parametrize("name", FAMILIES)
def test_samples_have_covariance_S(rng, name):
    factor = _random_factor(_families(rng)[name], rng)
    z = np.asarray(factor.sample(jax.random.key(1), 40_000))
    np.testing.assert_allclose(np.cov(z.T), factor.dense(), atol=0.06 * np.abs(factor.dense()).max())


def _logistic_model(rng, n=30, prior=None):
    X = rng.normal(size=(n, D))
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    prior = vj.GaussianFactor.isotropic(D, 1.5) if prior is None else prior
    return vj.LatentLinearModel(prior, vj.Sites(X * y[:, None], vj.potentials.Logistic()))


def _flat_objective(factor, model, m):
    free, fixed = eqx.partition(GaussianParams(jnp.asarray(m), factor), GaussianParams(True, factor.trainable()))
    x, unravel = ravel_pytree(free)
    return x, lambda x: vj.gkl.bound(eqx.combine(unravel(x), fixed), model)


# Compiled as one program per family (the draws share its structure), not op by op.
@eqx.filter_jit
def _flat_bound(factor, model, m, x):
    """The bound at the flattened (m, trainable factor leaves) ``x``, the rest of ``factor`` fixed."""
    return _flat_objective(factor, model, m)[1](x)


@eqx.filter_jit
def _flat_derivatives(factor, model, m):
    """``(x, ∇B(x), ∇²B(x))`` at the flattened (m, trainable factor leaves) of ``(m, factor)``."""
    x, f = _flat_objective(factor, model, m)
    return x, jax.grad(f)(x), jax.hessian(f)(x)


@pytest.mark.parametrize("name", FAMILIES)
def test_gradient_matches_finite_differences(rng, name):
    factor = _random_factor(_families(rng)[name], rng)
    model, m = _logistic_model(rng), rng.normal(size=D)
    x, g, _ = _flat_derivatives(factor, model, m)
    eps = 1e-6
    f = lambda x: _flat_bound(factor, model, m, x)
    fd = np.array([(f(x.at[i].add(eps)) - f(x.at[i].add(-eps))) / (2 * eps) for i in range(x.size)])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", CONCAVE)
def test_concave_for_log_concave_sites(rng, name):
    """Hessian negative semi-definite in (m, trainable factor) — Subspace with its basis fixed."""
    for _ in range(3):
        factor = _random_factor(_families(rng)[name], rng)
        eig = np.linalg.eigvalsh(_flat_derivatives(factor, _logistic_model(rng), rng.normal(size=D))[2])
        assert eig.max() <= 1e-8 * np.abs(eig).max(), eig.max()


def test_factor_analysis_is_not_concave(rng):
    """The thesis's warning: the FA log det makes the bound non-concave somewhere."""
    worst = -np.inf
    for _ in range(10):
        factor = _random_factor(cov.FactorAnalysis(2), rng)
        hessian = _flat_derivatives(factor, _logistic_model(rng), rng.normal(size=D))[2]
        worst = max(worst, np.linalg.eigvalsh(hessian).max())
    assert worst > 1e-6


@pytest.mark.slow
def test_sparse_mask_with_band_pattern_equals_banded(rng):
    band = np.triu(np.ones((D, D), bool)) & ~np.triu(np.ones((D, D), bool), 3)
    model = _logistic_model(rng)
    a = vj.infer(model, vj.GKL(covariance=cov.Banded(3)))
    b = vj.infer(model, vj.GKL(covariance=cov.SparseMask(band)))
    np.testing.assert_allclose(a.log_z, b.log_z, rtol=1e-10)
    np.testing.assert_allclose(a.covariance, b.covariance, atol=1e-8)


TIGHT = vj.solvers.NewtonCG(tol=1e-9, max_iter=200)


# The members of Banded, Chevron, Subspace and SparseMask that contain every covariance are exact on
# conjugate models: test_methods.py (gkl_banded, gkl_chevron, gkl_subspace, gkl_sparse_mask).


def test_factor_analysis_full_rank_is_nearly_exact(rng):
    from helpers import gaussian_posterior

    X = rng.normal(size=(20, D))
    y = X @ rng.normal(size=D) + 0.5 * rng.normal(size=20)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(D, 2.0), vj.Sites(X, vj.potentials.Gaussian(y, 0.5)))
    post = vj.infer(model, vj.GKL(covariance=cov.FactorAnalysis(D), solver=vj.solvers.LBFGS(tol=1e-8, max_iter=5000)))
    log_z = gaussian_posterior(np.zeros(D), 2.0 * np.eye(D), X, y, 0.25)[2]
    assert log_z - 1e-5 <= post.log_z <= log_z + 1e-10


@pytest.mark.slow  # five full fits at D = 7 (~50 s): run with `python -m pytest -m slow`
def test_constrained_optima_are_ordered(rng):
    """Nested families: Diagonal ⊂ Banded(2) ⊂ Banded(4) ⊂ Full, Diagonal ⊂ Chevron ⊂ Full; all ≤ log Z."""
    model = _logistic_model(rng, n=40)
    z = {name: float(vj.infer(model, vj.GKL(covariance=f, solver=TIGHT)).log_z) for name, f in {
        "diag": cov.Diagonal(), "band2": cov.Banded(2), "band4": cov.Banded(4), "chev": cov.Chevron(3),
        "sub": cov.Subspace(3), "full": cov.Full()}.items()}
    tol = 1e-9
    assert z["diag"] <= z["band2"] + tol <= z["band4"] + 2 * tol <= z["full"] + 3 * tol
    assert z["diag"] <= z["chev"] + tol <= z["full"] + 2 * tol
    assert z["sub"] <= z["full"] + tol


@pytest.mark.parametrize("update", ["fixed_point", "gradient"])
@pytest.mark.slow
def test_subspace_basis_updates_help(rng, update):
    X = rng.normal(size=(50, D)) * np.linspace(0.3, 2.0, D)
    y = np.where(rng.random(50) < 0.5, -1.0, 1.0)
    model = vj.glm.logistic_regression(X, y, prior_variance=1.0)
    start = vj.infer(model, vj.GKL(covariance=cov.Subspace(2, num_updates=0), solver=TIGHT))
    updated = vj.infer(model, vj.GKL(covariance=cov.Subspace(2, num_updates=5, basis_update=update), solver=TIGHT))
    full = vj.infer(model, vj.GKL(solver=TIGHT))
    assert float(updated.log_z) <= float(full.log_z) + 1e-9
    assert float(updated.log_z) >= float(start.log_z) - (1e-3 if update == "fixed_point" else 1e-9)
    E = np.asarray(updated.factor.basis)
    np.testing.assert_allclose(E.T @ E, np.eye(2), atol=1e-10)


@pytest.mark.slow
def test_warm_start_across_families(rng):
    model = _logistic_model(rng)
    full = vj.infer(model, vj.GKL())
    chev = vj.infer(model, vj.GKL(covariance=cov.Chevron(2)), init=full)
    again = vj.infer(model, vj.GKL(covariance=cov.Chevron(2)), init=chev)
    assert bool(chev.diagnostics.converged)
    assert int(again.diagnostics.iterations) <= 1
    assert cov.Chevron(2).owns(chev.factor, D) and not cov.Chevron(3).owns(chev.factor, D)


@pytest.mark.parametrize("make", [lambda: cov.Banded(0), lambda: cov.Banded(D + 1), lambda: cov.Chevron(D + 1),
                                  lambda: cov.Subspace(0), lambda: cov.FactorAnalysis(2.5)])
def test_bad_structure_sizes_raise(make):
    with pytest.raises(ValueError):
        make().init(D, 1.0)


def test_sparse_mask_validation():
    with pytest.raises(ValueError, match="below the diagonal"):
        cov.SparseMask(np.ones((D, D), bool))
    with pytest.raises(ValueError, match="square"):
        cov.SparseMask(np.ones((D, D + 1), bool))
    with pytest.raises(ValueError, match="D = 7"):
        cov.SparseMask(np.eye(D, dtype=bool)).init(D + 1, 1.0)
    with pytest.raises(ValueError, match="basis_update"):
        cov.Subspace(2, basis_update="lanczos")


@pytest.mark.slow
def test_float32_fits(rng):
    X = rng.normal(size=(80, D)).astype(np.float32)
    y = np.where(rng.random(80) < 0.5, -1.0, 1.0).astype(np.float32)
    model = vj.glm.logistic_regression(X, y, prior_variance=1.0)
    ref = float(vj.infer(vj.glm.logistic_regression(X.astype(np.float64), y.astype(np.float64), prior_variance=1.0),
                         vj.GKL(covariance=cov.Chevron(2))).log_z)
    for family in (cov.Banded(2), cov.Chevron(2), cov.Subspace(2), cov.FactorAnalysis(2)):
        post = vj.infer(model, vj.GKL(covariance=family, solver=None if not isinstance(family, cov.FactorAnalysis)
                                      else vj.solvers.LBFGS(tol=1e-2)))
        assert post.mean.dtype == jnp.float32 and np.isfinite(float(post.log_z))
        assert abs(float(post.log_z) - ref) < 1.0
