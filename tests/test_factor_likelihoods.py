"""Factor-model column likelihoods built on the core: the LVB local bounds at their optimal ξ, the
piecewise site and the Gaussian / Poisson potentials, against the closed forms of the Khan thesis."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammaln

import vijax as vj
from vijax import _piecewise

RNG = np.random.default_rng(11)
D = 40
MEAN = jnp.asarray(RNG.normal(size=(D, 1)) * 4.0)
VAR = jnp.asarray(RNG.uniform(1e-3, 10.0, size=(D, 1, 1)))
m, v = MEAN[:, 0], VAR[:, 0, 0]
softplus = lambda x: np.logaddexp(0.0, np.asarray(x))


def test_local_bounds_at_their_optimum_are_the_thesis_bounds():
    # ⟨log σ(x)⟩ ≥ log σ(ξ) + (μ − ξ)/2 at ξ = √(μ² + v) (Jaakkola), ≥ log σ(μ) − v/8 (Böhning).
    xi = np.sqrt(np.asarray(m) ** 2 + np.asarray(v))
    np.testing.assert_allclose(vj.lvb.Jaakkola().expected(m, v), -softplus(-xi) + 0.5 * (m - xi), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(vj.lvb.Bohning().expected(m, v), -softplus(-m) - v / 8, rtol=1e-13, atol=1e-13)
    # ... and ξ is optimal: the bound at other ξ is lower.
    for scale in (0.5, 0.9, 1.1, 2.0):
        a, A, c = vj.lvb.Jaakkola().quadratic(scale * jnp.asarray(xi))
        assert np.all(np.asarray(a * m - 0.5 * A * (m**2 + v) + c) <= np.asarray(vj.lvb.Jaakkola().expected(m, v)) + 1e-12)


@pytest.mark.parametrize("bound", ["jaakkola", "bohning", "piecewise"])
def test_bernoulli_bound_equals_the_closed_form(bound):
    y = jnp.asarray(RNG.integers(0, 2, D).astype(float))
    got = np.asarray(vj.factor.Bernoulli(bound).expected(y, MEAN, VAR))
    if bound == "jaakkola":
        xi = np.sqrt(np.asarray(m) ** 2 + np.asarray(v))
        llp = 0.5 * (m - xi) + softplus(xi)  # thesis eq. 4.43
    elif bound == "bohning":
        llp = softplus(m) + v / 8.0  # eq. 4.41
    else:
        llp = np.asarray(_piecewise.expected("quadratic", 20, m, jnp.sqrt(v)))
    np.testing.assert_allclose(got, np.asarray(y) * np.asarray(m) - llp, rtol=1e-13, atol=1e-12)
    # A bound: below ⟨log p(y | η)⟩ by 200-node Gauss–Hermite.
    exact = vj.quadrature.GaussHermite(200).expect(lambda e: y * e - jax.nn.softplus(e), m, jnp.sqrt(v))
    assert np.all(got <= np.asarray(exact) + 1e-10)


def test_gaussian_and_poisson_columns_are_exact():
    y = jnp.asarray(RNG.normal(size=D))
    noise = 0.7
    got = vj.factor.GaussianColumn(noise).for_columns(D).expected(y, MEAN, VAR)
    want = -0.5 * (np.log(2 * np.pi * noise) + ((np.asarray(y) - m) ** 2 + v) / noise)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    counts = jnp.asarray(RNG.integers(0, 9, D).astype(float))
    got = vj.factor.PoissonColumn().expected(counts, MEAN, VAR)
    want = np.asarray(counts) * m - np.exp(m + 0.5 * v) - np.asarray(gammaln(counts + 1))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # Exact log p, and the gradient in ṽ = −1/(2ψ) (the Gaussian's constant curvature ½·curvature()).
    np.testing.assert_allclose(vj.factor.PoissonColumn().log_prob(counts, MEAN),
                               np.asarray(counts) * m - np.exp(m) - np.asarray(gammaln(counts + 1)), rtol=1e-12)
    g = jax.grad(lambda c: jnp.sum(vj.factor.GaussianColumn(noise).for_columns(D).expected(y, MEAN, c)))(VAR)
    np.testing.assert_allclose(g[:, 0, 0], -0.5 / noise, rtol=1e-12)


def test_column_names_and_checks():
    assert not hasattr(vj.factor, "Gaussian") and not hasattr(vj.factor, "Poisson")  # vj.potentials has those
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vj.factor.GaussianColumn(), vj.factor.PoissonColumn(), vj.factor.Bernoulli()
    with pytest.raises(ValueError, match="noise"):
        vj.factor.GaussianColumn(-1.0)
