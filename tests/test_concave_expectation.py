"""The `concave_expectation` flag of the potentials: what it promises (a concave Gaussian expectation,
so λ* ≥ 0) checked by Hessians of ⟨log φ⟩ in (μ, σ) on a grid, and where the G-KL code reads it."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax.methods import _gkl_natural
from vijax.potentials import (Cauchy, Gaussian, Laplace, Logistic, Masked, PiecewiseLogistic, Poisson, Probit,
                              StudentT)

CONCAVE = {
    "logistic": Logistic(),
    "probit": Probit(),
    "laplace": Laplace(loc=0.3, scale=0.7),
    "gaussian": Gaussian(loc=-0.4, scale=0.5),
    "poisson": Poisson(counts=3.0),
    "piecewise_linear": PiecewiseLogistic(10, "linear"),
}
NOT_CONCAVE = {
    "student_t": StudentT(df=3.0, loc=0.0, scale=1.0),
    "cauchy": Cauchy(loc=0.0, scale=1.0),
    "piecewise_quadratic": PiecewiseLogistic(20, "quadratic"),
}


@eqx.filter_jit  # one program per potential and grid, not op by op
def _hessians(potential, x):
    """∇² ⟨log φ(μ + σz)⟩ in (μ, σ) at every row (μ, σ) of ``x``."""
    return jax.vmap(jax.hessian(lambda p: potential.expected_log_phi(p[0], p[1])))(x)


def _largest_hessian_eigenvalue(potential, mu, sigma):
    """max over the grid of the largest eigenvalue of ∇² ⟨log φ(μ + σz)⟩ in (μ, σ), and the scale of ∇²."""
    x = jnp.stack(jnp.broadcast_arrays(mu[:, None], sigma[None, :]), -1).reshape(-1, 2)
    H = np.asarray(_hessians(potential, x))
    eig = np.linalg.eigvalsh(H)
    return eig[:, -1].max(), np.abs(eig).max()


def test_concave_expectation_flags():
    for name, potential in CONCAVE.items():
        assert potential.concave_expectation is True, name
        assert potential.concave_expectation == potential.log_concave, name
    for name, potential in NOT_CONCAVE.items():
        assert potential.concave_expectation is False, name
    assert not vj.potentials.Heaviside(eps=0.1).concave_expectation
    assert vj.potentials.Custom(jax.nn.log_sigmoid, log_concave=True).concave_expectation
    assert not vj.potentials.Custom(jax.nn.log_sigmoid).concave_expectation
    assert Masked(Logistic(), jnp.array([True, False])).concave_expectation
    assert not Masked(PiecewiseLogistic(), jnp.array([True, False])).concave_expectation


@pytest.mark.parametrize("name", sorted(CONCAVE))
def test_flagged_expectations_are_concave(name):
    mu, sigma = jnp.linspace(-6.0, 6.0, 49), jnp.geomspace(0.05, 8.0, 17)
    top, scale = _largest_hessian_eigenvalue(CONCAVE[name], mu, sigma)
    assert top <= 1e-9 * scale, (name, top, scale)


def test_quadratic_piecewise_expectation_is_not_concave_for_narrow_q():
    """Why the quadratic piecewise bound is not flagged: its jumps (< ε_20 = 1.4e-4) give ⟨log φ⟩ a
    positive curvature, in μ alone too (λ* < 0), while σ is small; from σ ≈ 1 on it is concave."""
    potential = NOT_CONCAVE["piecewise_quadratic"]
    mu = jnp.linspace(-12.0, 12.0, 2401)
    top, _ = _largest_hessian_eigenvalue(potential, mu, jnp.array([0.01]))
    assert top > 0.1
    curvature_in_mu = jax.jit(jax.vmap(jax.grad(jax.grad(lambda m: potential.expected_log_phi(m, 0.01)))))(mu)
    assert float(jnp.max(curvature_in_mu)) > 0.1
    top, scale = _largest_hessian_eigenvalue(potential, mu[::20], jnp.array([2.0, 5.0]))
    assert top <= 1e-9 * scale


def test_natural_parameter_gkl_applies_by_the_flag():
    X = np.random.default_rng(0).normal(size=(12, 2))
    H = X * np.where(X[:, 0] > 0, 1.0, -1.0)[:, None]
    prior = vj.GaussianFactor.isotropic(dim=2, variance=1.0)
    model = lambda potential: vj.LatentLinearModel(prior, vj.Sites(H, potential))
    assert _gkl_natural.applies(model(Logistic()))
    assert _gkl_natural.applies(model(PiecewiseLogistic(10, "linear")))
    assert not _gkl_natural.applies(model(PiecewiseLogistic(20, "quadratic")))
    assert not _gkl_natural.applies(model(StudentT(df=3.0)))
