"""Piecewise bounds on the logistic likelihood: validity on a dense grid, shipped maximum errors,
closed-form Gaussian expectations against SciPy quadrature (tails included), gradients, the G-KL
bound ordering exact ≥ piecewise ≥ exact − N ε_R, and Khan's 1-D binary latent Gaussian experiment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate
from scipy.special import expit

import vijax as vj
from vijax import piecewise as pw

from helpers import logistic_data

KINDS = pw.KINDS
PIECES = pw.PIECES
TIGHT_GKL = vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-10, max_iter=200))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _numpy_bound(kind, R):
    """f̄ from the shipped table, in NumPy (an oracle independent of the JAX code)."""
    t, coef, _ = pw.table(kind, R)

    def bound(x):
        c, b, a = coef[np.searchsorted(t, x, side="right")].T
        return (c * x + b) * x + a

    return bound


# ------------------------------------------------------------------------------- the bounds


@pytest.mark.parametrize("kind", KINDS)
def test_bounds_hold_on_a_dense_grid_with_the_shipped_maximum_error(kind):
    x = np.linspace(-50.0, 50.0, 200_001)
    for R in PIECES:
        gap = np.asarray(pw.value(kind, R, jnp.asarray(x))) - _softplus(x)
        eps = pw.max_error(kind, R)
        assert gap.min() >= 0.0, (kind, R, gap.min())
        assert eps * (1 - 1e-3) <= gap.max() <= eps + 1e-12, (kind, R, gap.max(), eps)


def test_maximum_error_falls_with_pieces_and_quadratic_is_much_tighter():
    lin = np.array([pw.max_error("linear", R) for R in PIECES])
    quad = np.array([pw.max_error("quadratic", R) for R in PIECES])
    assert np.all(np.diff(lin) < 0) and np.all(np.diff(quad) < 0)
    # Hsiung et al.: the optimal linear bound's error falls like √2 / R².
    R = np.array(PIECES)
    assert np.all(np.abs(lin * R**2 / np.sqrt(2) - 1) < 0.5)
    # Quadratic pieces: more than an order of magnitude tighter from R = 9 on (≥ 3× everywhere).
    ratio = lin / quad
    assert np.all(ratio > 3) and np.all(ratio[R >= 9] > 10), ratio
    # Khan (thesis Fig. 4.4): Q3 ≈ L6, and linear bounds need about twice the pieces to match.
    assert 0.8 < pw.max_error("linear", 6) / pw.max_error("quadratic", 3) < 1.25
    for r in (5, 7, 9):
        assert pw.max_error("linear", 2 * r) > pw.max_error("quadratic", r)


def test_linear_bound_is_a_max_of_lines_and_quadratic_pieces_mirror():
    t, coef, _ = pw.table("linear", 9)
    x = np.linspace(-20, 20, 4001)
    np.testing.assert_allclose(np.max(coef[:, 1] * x[:, None] + coef[:, 2], axis=1),
                               np.asarray(pw.value("linear", 9, jnp.asarray(x))), atol=1e-12)
    for kind in KINDS:
        for R in (3, 8, 13):
            t, coef, _ = pw.table(kind, R)
            np.testing.assert_allclose(t, -t[::-1], atol=1e-12)
            # f(−x) = f(x) − x maps (c, b, a) on [l, h] to (c, 1 − b, a) on [−h, −l].
            mirrored = coef[::-1] * [1, -1, 1] + [0, 1, 0]
            np.testing.assert_allclose(coef, mirrored, atol=1e-9)
            assert np.all(coef[:, 0] >= 0) and (kind == "quadratic" or np.all(coef[:, 0] == 0))


def test_fitter_reproduces_the_shipped_table():
    for kind in KINDS:
        entry = pw.fit(kind, 4)
        t, coef, eps = pw.table(kind, 4)
        np.testing.assert_allclose(entry["breakpoints"], t, atol=1e-8)
        np.testing.assert_allclose(entry["coefficients"], coef, atol=1e-8)
        np.testing.assert_allclose(entry["max_error"], eps, rtol=1e-6)


# --------------------------------------------------------------------- Gaussian expectations

MOMENTS = [(m, v) for m in (-30.0, -3.0, 0.0, 0.7, 4.0, 30.0) for v in (1e-4, 1e-2, 1.0, 1e2)]


def _quad(fn, m, v, breakpoints):
    s = np.sqrt(v)
    dens = lambda x: np.exp(-0.5 * ((x - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))
    lo, hi = m - 40 * s, m + 40 * s
    points = [t for t in breakpoints if lo < t < hi] + [m]
    return integrate.quad(lambda x: fn(x) * dens(x), lo, hi, points=sorted(points), limit=400,
                          epsabs=0.0, epsrel=1e-12)[0]


@pytest.mark.parametrize("kind,R", [("linear", 3), ("quadratic", 3), ("quadratic", 20)])
def test_closed_form_expectations_match_quadrature(kind, R):
    t, _, _ = pw.table(kind, R)
    bound = _numpy_bound(kind, R)
    ms, vs = (jnp.asarray(a) for a in zip(*MOMENTS))
    mean_f, log_mean_exp = jax.jit(lambda m, s: (pw.expected(kind, R, m, s), pw.log_expected_exp_neg(kind, R, m, s)))(
        ms, np.sqrt(np.asarray(vs)))
    for (m, v), got, got_log in zip(MOMENTS, mean_f, log_mean_exp):
        want = _quad(bound, m, v, t)
        assert abs(got - want) <= 1e-10 * max(1.0, abs(want)), (m, v, got, want)
        want_exp = _quad(lambda x: np.exp(-bound(x)), m, v, t)
        if want_exp > 1e-200:
            assert abs(got_log - np.log(want_exp)) <= 1e-8 * max(1.0, abs(np.log(want_exp))), (m, v)
        else:
            assert got_log < -400  # e^{−f̄} ≈ e^{−x}: ⟨·⟩ underflows for m = 30, v small


def test_expectation_bounds_the_logistic_expectation_within_max_error(rng):
    mu, sigma = rng.normal(scale=5, size=200), np.exp(rng.uniform(-5, 3, size=200))
    both = lambda site: jax.jit(lambda m, s: (site.expected_log_phi(m, s), site.log_expected_phi(m, s)))(mu, sigma)
    exact, exact_pred = both(vj.potentials.Logistic())
    for kind, R in (("linear", 6), ("quadratic", 3), ("quadratic", 20)):
        site = vj.potentials.PiecewiseLogistic(R, kind)
        got, log_pred = both(site)
        assert np.all(got <= exact + 1e-10) and np.all(got >= exact - site.max_error - 1e-10)
        assert np.all(log_pred <= exact_pred + 1e-8) and np.all(log_pred >= exact_pred - site.max_error - 1e-8)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_are_finite_and_match_finite_differences(kind):
    R = 11
    m = jnp.array([0.3, -2.0, 5.0, 30.0, -30.0, 1.0])
    s = jnp.array([1.2, 0.05, 3.0, 1e-2, 10.0, 1e-3])
    hm, hs = 1e-6 * jnp.maximum(1.0, jnp.abs(m)), 1e-6 * s
    for fn in (pw.expected, pw.log_expected_exp_neg):
        f = lambda a, b: fn(kind, R, a, b)

        def checks(m, s):
            """The gradient, its central differences, and the values per site (vmap) and vectorised."""
            gm, gs = jax.vmap(jax.grad(f, argnums=(0, 1)))(m, s)
            fd_m = (f(m + hm, s) - f(m - hm, s)) / (2 * hm)
            fd_s = (f(m, s + hs) - f(m, s - hs)) / (2 * hs)
            return gm, gs, fd_m, fd_s, jax.vmap(f)(m, s), f(m, s)

        gm, gs, fd_m, fd_s, per_site, vectorised = jax.jit(checks)(m, s)
        assert np.all(np.isfinite(gm)) and np.all(np.isfinite(gs))
        scale = 1 + np.abs(m)  # finite differences of values of size |m| lose about 1e-10 · |m| / h
        np.testing.assert_allclose(gm / scale, fd_m / scale, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gs / scale, fd_s / scale, rtol=1e-5, atol=1e-6)
        # Vectorised over sites, under jit and vmap: the same values.
        np.testing.assert_allclose(per_site, vectorised, rtol=1e-13)


def _reference_expected(kind, R, mean, sd):
    """The former per-piece implementation: four `ndtr`s per piece, derivatives by autodiff."""
    from jax.scipy.special import ndtr

    t, coef, _ = pw.table(kind, R)
    c, b, a = coef.T
    clip = 40.0
    s = jnp.maximum(sd, jnp.finfo(sd.dtype).tiny ** 0.25)
    inner = jnp.clip((t - mean[..., None]) / s[..., None], -clip, clip)
    ends = jnp.full(mean.shape + (1,), clip)
    lo, hi = jnp.concatenate([-ends, inner], -1), jnp.concatenate([inner, ends], -1)
    pdf = lambda z: jnp.exp(-0.5 * z**2) / np.sqrt(2 * np.pi)
    m0 = jnp.where(lo > 0, ndtr(-lo) - ndtr(-hi), ndtr(hi) - ndtr(lo))
    m1 = pdf(lo) - pdf(hi)
    m2 = m0 + lo * pdf(lo) - hi * pdf(hi)
    m, s = mean[..., None], s[..., None]
    return jnp.sum(c * s**2 * m2 + s * (2 * c * m + b) * m1 + ((c * m + b) * m + a) * m0, -1)


def _grid(means, sds):
    m, s = np.meshgrid(np.asarray(means, float), np.asarray(sds, float))
    return jnp.asarray(m.ravel()), jnp.asarray(s.ravel())


def _derivatives(fn, m, s):
    """Value, gradient and Hessian in (mean, sd) per pair, under jit and vmap: one program."""
    def all_three(m, s):
        grad = jax.vmap(jax.grad(fn, argnums=(0, 1)))(m, s)
        hess = jax.vmap(jax.hessian(fn, argnums=(0, 1)))(m, s)
        return fn(m, s), jnp.stack(grad, -1), jnp.stack([jnp.stack(row, -1) for row in hess], -1)

    return jax.jit(all_three)(m, s)


def _close(got, want, tol):
    err = np.abs(np.asarray(got) - np.asarray(want)) / np.maximum(1.0, np.abs(np.asarray(want)))
    assert np.all(np.isfinite(got)) and err.max() <= tol, (err.max(), np.unravel_index(err.argmax(), err.shape))


# For even R a breakpoint sits at exactly 0, so the grids put means on it.
@pytest.mark.parametrize("kind,R", [("linear", 8), ("quadratic", 3), ("quadratic", 20)])
def test_closed_form_expected_and_derivatives_match_the_per_piece_reference(kind, R):
    new = lambda a, b: pw.expected(kind, R, a, b)
    old = lambda a, b: _reference_expected(kind, R, a, b)
    # Values everywhere, tiny and zero sd (the floor) included.
    m, s = _grid(np.r_[np.linspace(-40, 40, 161), 0.0, 1e-15, -1e-9], np.r_[np.logspace(-6, 3, 37), 0.0])
    _close(jax.jit(new)(m, s), jax.jit(old)(m, s), 1e-13)
    # First derivatives: the reference's autodiff cancels terms of size 1/sd, so it is good to
    # about 1e-16/sd; the closed form has no such loss (checked against 60-digit mpmath offline).
    grad = lambda f: jnp.stack(jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1))))(m, s), -1)
    _close(grad(new), grad(old), 1e-10)
    # Second derivatives through the custom rule: the reference is good to about 1e-16/sd² here.
    m, s = _grid(np.r_[np.linspace(-40, 40, 81), 0.0, 1e-15], np.logspace(-3, 3, 19))
    for got, want in zip(_derivatives(new, m, s), _derivatives(old, m, s)):
        _close(got, want, 1e-8)
    # Huge means: values agree as far as the formula's own rounding allows.
    m, s = _grid([-1e3, -300.0, 300.0, 1e3, 1e6], np.logspace(-6, 2, 17))
    for got, want in zip(_derivatives(new, m, s), _derivatives(old, m, s)):
        _close(got, want, 1e-12)


def test_closed_form_second_derivatives_with_the_mean_on_a_breakpoint():
    """m = t exactly, sd small: ∂²⟨f̄⟩/∂m² ≈ (jump of f̄′) N(0)/sd, with the sign of that jump."""
    t, coef, _ = pw.table("quadratic", 8)
    k = len(t) // 2
    assert t[k] == 0.0
    c, b, _ = coef.T
    hessian = jax.jit(jax.hessian(lambda a, s: pw.expected("quadratic", 8, a, s), argnums=(0, 1)))
    reference = jax.jit(jax.hessian(lambda a, s: _reference_expected("quadratic", 8, a, s), argnums=(0, 1)))
    for sd in (1e-6, 1e-3):
        h = hessian(jnp.float64(0.0), jnp.float64(sd))
        want = (b[k + 1] - b[k]) / (sd * np.sqrt(2 * np.pi)) + c[k] + c[k + 1]
        np.testing.assert_allclose(h[0][0], want, rtol=1e-6)
        old = reference(jnp.float64(0.0), jnp.float64(sd))
        np.testing.assert_allclose(h[0][0], old[0][0], rtol=1e-8)


def test_closed_form_expected_in_float32_under_jit_and_vmap():
    m64, s64 = _grid(np.linspace(-40, 40, 41), np.logspace(-3, 2, 11))
    m, s = m64.astype(jnp.float32), s64.astype(jnp.float32)
    for kind in KINDS:
        fn = lambda a, b: pw.expected(kind, 20, a, b)
        value, grad, hess = _derivatives(fn, m, s)
        assert value.dtype == grad.dtype == hess.dtype == jnp.float32
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(grad)) and np.all(np.isfinite(hess))
        want, want_grad, _ = _derivatives(fn, m64, s64)
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-4)
        # Any batch shape, and broadcasting of a scalar sd (two programs, fused differently: float32 rounding
        # of the sums over pieces, a few tens of ulps, as the float64 comparison above allows).
        np.testing.assert_allclose(jax.jit(fn)(m.reshape(11, 41), s.reshape(11, 41)), value.reshape(11, 41),
                                   rtol=1e-5, atol=1e-5)
        broadcast, mapped = jax.jit(lambda a: (fn(a, 0.5), jax.vmap(lambda x: fn(x, 0.5))(a)))(m64[:41])
        np.testing.assert_allclose(broadcast, mapped, rtol=1e-14)


def test_potential_flags_errors_and_float32():
    with pytest.raises(ValueError, match="bound_logistic_sites"):
        vj.LVB(bound="piecewise_quadratic")
    assert vj.potentials.PiecewiseLogistic(5, "linear").log_concave
    assert not vj.potentials.PiecewiseLogistic(5, "quadratic").log_concave
    assert vj.potentials.PiecewiseLogistic().labels_in_projection
    with pytest.raises(ValueError, match="kind"):
        vj.potentials.PiecewiseLogistic(5, "cubic")
    with pytest.raises(ValueError, match="pieces"):
        vj.potentials.PiecewiseLogistic(40)
    site = vj.potentials.PiecewiseLogistic(20)
    x = jnp.linspace(-8, 8, 33, dtype=jnp.float32)
    assert site.log_phi(x).dtype == jnp.float32
    value = site.expected_log_phi(x, jnp.full_like(x, 0.5))
    assert value.dtype == jnp.float32 and np.all(np.isfinite(value))


# ------------------------------------------------------------------------- G-KL with the bounds


def _logistic_regression(rng, n=60, d=5):
    X, y = logistic_data(rng, n, d)
    return vj.glm.logistic_regression(X, y, prior_variance=2.0)


def test_bound_logistic_sites_replaces_only_logistic_groups(rng):
    X = rng.normal(size=(10, 3))
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3, 1.0),
                                 (vj.Sites(X, vj.potentials.Logistic()),
                                  vj.Sites(vj.Identity(3), vj.potentials.Laplace(0.0, 1.0))))
    bounded = pw.bound_logistic_sites(model, "linear", 7)
    first, second = (group.potential for group in bounded.sites)
    assert isinstance(first, vj.potentials.PiecewiseLogistic) and (first.kind, first.pieces) == ("linear", 7)
    assert second is model.sites[1].potential and bounded.prior is model.prior


@pytest.mark.slow
def test_gkl_with_piecewise_sites_is_a_lower_bound_within_n_max_error(rng):
    model = _logistic_regression(rng)
    exact = vj.infer(model, TIGHT_GKL)
    n = model.sites[0].num_sites
    for kind, R in (("linear", 6), ("quadratic", 20)):
        bounded = pw.bound_logistic_sites(model, kind, R)
        assert isinstance(bounded.sites[0].potential, vj.potentials.PiecewiseLogistic)
        post = vj.infer(bounded, TIGHT_GKL)
        assert bool(post.diagnostics.converged) and post.is_lower_bound
        eps = pw.max_error(kind, R)
        assert exact.log_z - n * eps - 1e-8 <= post.log_z <= exact.log_z + 1e-8, (kind, R)
        # The bound at the piecewise optimum, evaluated exactly, is between the two.
        at_q = vj.gkl.bound_at(post, model)
        assert post.log_z - 1e-8 <= at_q <= exact.log_z + 1e-8
    np.testing.assert_allclose(post.mean, exact.mean, atol=1e-3)


# ------------------------------------------------ Khan's 1-D binary latent Gaussian model (E3)

MU_STAR, SIGMA_STAR = 2.0, 2.0


def _exact_p(sigma):
    return _quad(expit, MU_STAR, sigma**2, [])


def _quadratic_bound_log_mass(a, A, c, m, s):
    """log ∫ exp(a x − ½ A x² + c) N(x | m, s²) dx."""
    k = 1 + A * s**2
    return -0.5 * np.log(k) + (2 * m * a + a**2 * s**2 - A * m**2) / (2 * k) + c


def _log_lik_curve(log_p1, log_p0, p_star):
    return p_star * log_p1 + (1 - p_star) * log_p0


def test_khan_1d_binary_piecewise_recovers_sigma_jaakkola_shrinks_it():
    """Infinite data from μ* = σ* = 2 (p* = 0.7752); maximise the bound on the log likelihood over σ."""
    p_star = _exact_p(SIGMA_STAR)
    np.testing.assert_allclose(p_star, 0.7752, atol=1e-4)
    sigmas = np.linspace(0.01, 5.0, 250)
    exact = np.array([_log_lik_curve(np.log(p), np.log1p(-p), p_star) for p in map(_exact_p, sigmas)])
    sigma_exact = sigmas[np.argmax(exact)]
    assert abs(sigma_exact - SIGMA_STAR) < 0.02

    site = vj.potentials.PiecewiseLogistic(20, "quadratic")
    s = jnp.asarray(sigmas)
    curve = _log_lik_curve(site.log_expected_phi(MU_STAR + 0 * s, s), site.log_expected_phi(-MU_STAR + 0 * s, s),
                           p_star)
    sigma_q20 = sigmas[np.argmax(np.asarray(curve))]
    assert abs(sigma_q20 - sigma_exact) < 0.1 * sigma_exact

    # Jaakkola with its ξ optimised for each label and σ (a grid of ξ is plenty here).
    xi = np.linspace(1e-3, 30.0, 3000)
    a, A, c = (np.asarray(v)[:, None] for v in vj.lvb.Jaakkola().quadratic(jnp.asarray(xi)))
    best = lambda m: np.max(_quadratic_bound_log_mass(a, A, c, m, sigmas[None, :]), axis=0)
    curve_j = _log_lik_curve(best(MU_STAR), best(-MU_STAR), p_star)
    sigma_j = sigmas[np.argmax(curve_j)]
    assert sigma_j < 0.5 * sigma_exact
    assert np.all(curve_j <= exact + 1e-9) and np.all(np.asarray(curve) <= exact + 1e-9)
