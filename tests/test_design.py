"""vj.design: sparse linear models, image filters, information gain, Lanczos free design, the design loop."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

import vijax as vj
from vijax.design import filters

NU2 = 0.01


def _fd_dense(h, w, periodic=False):
    """Finite differences written out entry by entry."""
    rows = []
    idx = np.arange(h * w).reshape(h, w)
    for i in range(h):
        for j in range(w if periodic else w - 1):
            r = np.zeros(h * w)
            r[idx[i, (j + 1) % w]] += 1
            r[idx[i, j]] -= 1
            rows.append(r)
    for i in range(h if periodic else h - 1):
        for j in range(w):
            r = np.zeros(h * w)
            r[idx[(i + 1) % h, j]] += 1
            r[idx[i, j]] -= 1
            rows.append(r)
    return np.array(rows)


# --- filters ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("periodic", [False, True])
def test_finite_differences_match_dense_matrix(periodic):
    h, w = 4, 5
    F = filters.finite_differences((h, w), periodic=periodic)
    dense = _fd_dense(h, w, periodic)
    assert F.shape == dense.shape == ((2 * h * w) if periodic else (h * (w - 1) + (h - 1) * w), h * w)
    rng = np.random.default_rng(0)
    x, y, V = rng.normal(size=h * w), rng.normal(size=dense.shape[0]), rng.normal(size=(h * w, 3))
    np.testing.assert_allclose(F.mv(x), dense @ x, atol=1e-12)
    np.testing.assert_allclose(F.mv(V), dense @ V, atol=1e-12)
    np.testing.assert_allclose(F.rmv(y), dense.T @ y, atol=1e-12)
    np.testing.assert_allclose(F.squared_mv(x), dense**2 @ x, atol=1e-12)
    np.testing.assert_allclose(F.squared_rmv(y), (dense**2).T @ y, atol=1e-12)
    np.testing.assert_allclose(F.gram(jnp.asarray(y)), dense.T @ (y[:, None] * dense), atol=1e-12)


def test_wavelets_match_pywavelets_and_are_orthonormal():
    pywt = pytest.importorskip("pywt")
    h, w = 8, 16  # two levels: the coarse filters wrap around the image, as in PyWavelets' periodization
    W = filters.wavelets((h, w), levels=2)
    image = np.random.default_rng(1).normal(size=(h, w))
    with pytest.warns(UserWarning, match="boundary effects"):
        coeffs = pywt.wavedec2(image, "db4", mode="periodization", level=2)
    expected = np.concatenate([coeffs[0].ravel()] + [c.ravel() for level in coeffs[1:] for c in level])
    np.testing.assert_allclose(W.mv(jnp.asarray(image.ravel())), expected, atol=1e-12)
    dense = np.asarray(filters.as_dense(W))
    np.testing.assert_allclose(dense @ dense.T, np.eye(h * w), atol=1e-12)
    np.testing.assert_allclose(W.rmv(W.mv(jnp.asarray(image.ravel()))), image.ravel(), atol=1e-12)
    v = np.random.default_rng(2).normal(size=h * w)
    np.testing.assert_allclose(W.squared_mv(v), dense**2 @ v, atol=1e-12)
    np.testing.assert_allclose(W.squared_rmv(v), (dense**2).T @ v, atol=1e-12)
    V = np.random.default_rng(3).normal(size=(h * w, 3))  # K columns at once, and the weighted Gram matrix
    np.testing.assert_allclose(W.mv(V), dense @ V, atol=1e-12)
    np.testing.assert_allclose(W.rmv(V), dense.T @ V, atol=1e-12)
    np.testing.assert_allclose(W.squared_rmv(V), (dense**2).T @ V, atol=1e-12)
    np.testing.assert_allclose(W.gram(jnp.asarray(v)), dense.T @ (v[:, None] * dense), atol=1e-12)
    assert filters.max_level((64, 64)) == pywt.dwt_max_level(64, 8) == 3


def test_wavelet_products_are_jittable_and_float32():
    W = filters.wavelets((16, 16), levels=1, dtype=jnp.float32)
    x = jnp.arange(256, dtype=jnp.float32) / 256
    y = jax.jit(lambda op, v: op.mv(v))(W, x)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(np.linalg.norm(y), np.linalg.norm(x), rtol=1e-5)  # orthonormal


def test_stack_and_bad_shapes():
    B = filters.stack(filters.finite_differences((4, 4)), filters.wavelets((4, 4), levels=1), np.eye(16))
    dense = np.concatenate([_fd_dense(4, 4), np.asarray(filters.as_dense(filters.wavelets((4, 4), levels=1))),
                            np.eye(16)])
    y = np.random.default_rng(3).normal(size=dense.shape[0])
    np.testing.assert_allclose(filters.as_dense(B), dense, atol=1e-12)
    np.testing.assert_allclose(B.rmv(y), dense.T @ y, atol=1e-12)
    np.testing.assert_allclose(B.squared_mv(np.ones(16)), (dense**2).sum(1), atol=1e-12)
    with pytest.raises(ValueError, match="different dimensions"):
        filters.stack(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="multiples of 2"):
        filters.wavelets((12, 12), levels=3)
    with pytest.raises(ValueError, match="image shape"):
        filters.finite_differences((4,))


# --- the model ----------------------------------------------------------------------------------------------------

def test_sparse_linear_model_log_joint_and_validation():
    rng = np.random.default_rng(4)
    M, y, w = rng.normal(size=(3, 16)), rng.normal(size=3), rng.normal(size=16)
    B = filters.finite_differences((4, 4))
    tau = 0.3
    model = vj.design.sparse_linear_model(M, y, NU2, B, vj.potentials.Laplace(scale=tau))
    assert model.prior is None and len(model.sites) == 2
    s = _fd_dense(4, 4) @ w
    expected = (-0.5 * np.sum((y - M @ w) ** 2) / NU2 - 1.5 * np.log(2 * np.pi * NU2)
                - np.sum(np.abs(s)) / tau - s.size * np.log(2 * tau))
    np.testing.assert_allclose(model.log_joint(jnp.asarray(w)), expected, rtol=1e-12)
    sparse_M = jsparse.BCOO.fromdense(M)
    model_sparse = vj.design.sparse_linear_model(sparse_M, y, NU2, B, vj.potentials.StudentT(df=3.0, scale=0.2))
    assert model_sparse.sites[0].projection.shape == (3, 16)
    with pytest.raises(ValueError, match="y has 2 entries"):
        vj.design.sparse_linear_model(M, y[:2], NU2, B, vj.potentials.Laplace(scale=tau))
    with pytest.raises(ValueError, match="B has 9"):
        vj.design.sparse_linear_model(M, y, NU2, np.eye(9), vj.potentials.Laplace(scale=tau))
    with pytest.raises(ValueError, match="noise_variance"):
        vj.design.sparse_linear_model(M, y, -1.0, B, vj.potentials.Laplace(scale=tau))
    with pytest.raises(ValueError, match="must be vj.potentials.Laplace"):
        vj.design.sparse_linear_model(M, y, NU2, B, vj.potentials.Logistic())


# --- criteria -----------------------------------------------------------------------------------------------------

def _chevron_factor(D=12, K=4, seed=5):
    rng = np.random.default_rng(seed)
    head = np.triu(rng.normal(size=(K, D)))
    head[np.arange(K), np.arange(K)] = np.abs(head[np.arange(K), np.arange(K)]) + 0.5
    tail = rng.uniform(0.3, 1.0, size=D - K)
    return vj.covariance.ChevronFactor(jnp.asarray(head), jnp.asarray(tail))


def test_information_gain_matches_dense_logdet():
    factor = _chevron_factor()
    S = np.asarray(factor.dense())
    rng = np.random.default_rng(6)
    blocks = rng.normal(size=(5, 3, 12))
    expected = [0.5 * np.linalg.slogdet(np.eye(3) + b @ S @ b.T / NU2)[1] for b in blocks]
    np.testing.assert_allclose(vj.design.information_gain(factor, blocks, NU2), expected, rtol=1e-10)
    np.testing.assert_allclose(vj.design.information_gain(factor, blocks[0], NU2), expected[0], rtol=1e-10)
    np.testing.assert_allclose(vj.design.covariance_product(factor)(blocks[0].T), S @ blocks[0].T, atol=1e-12)
    rows = blocks[:, 0, :]
    np.testing.assert_allclose(vj.design.row_gains(factor, rows, NU2),
                               0.5 * np.log1p(np.einsum("cd,de,ce->c", rows, S, rows) / NU2), rtol=1e-10)
    # greedy picks: each the best single row under S conditioned on the rows picked before it
    idx, gains = vj.design.greedy_rows(factor, rows, 3, NU2)
    S_k, taken = S.copy(), []
    for i, g in zip(np.asarray(idx), np.asarray(gains)):
        scores = np.einsum("cd,de,ce->c", rows, S_k, rows)
        scores[taken] = -np.inf
        assert i == np.argmax(scores)
        np.testing.assert_allclose(g, 0.5 * np.log1p(scores[i] / NU2), rtol=1e-10)
        h = rows[i]
        S_k = S_k - np.outer(S_k @ h, S_k @ h) / (NU2 + h @ S_k @ h)
        taken.append(i)
    np.testing.assert_allclose(np.sum(gains), vj.design.information_gain(factor, rows[np.asarray(idx)], NU2),
                               rtol=1e-10)


def test_lanczos_eigenvectors_match_eigh():
    factor = _chevron_factor(D=30, K=6, seed=7)
    S = np.asarray(factor.dense())
    values, vectors = np.linalg.eigh(S)
    rows, top = vj.design.free_design(factor, 4, num_iter=24)  # fewer Lanczos steps than D = 30
    np.testing.assert_allclose(top, values[::-1][:4], rtol=1e-10)
    overlap = np.abs(np.sum(np.asarray(rows) * vectors[:, ::-1][:, :4].T, axis=1))
    np.testing.assert_allclose(overlap, 1.0, atol=1e-8)
    np.testing.assert_allclose(vj.design.entropy(factor), 0.5 * np.linalg.slogdet(2 * np.pi * np.e * S)[1],
                               rtol=1e-10)


def test_lanczos_variances_are_lower_bounds_that_become_exact():
    factor = _chevron_factor(D=30, K=6, seed=9)
    P = np.linalg.inv(np.asarray(factor.dense()))
    exact = np.diag(np.linalg.inv(P))
    product = lambda v: jnp.asarray(P) @ v  # noqa: E731
    few, *_ = vj.design.lanczos_variances(product, 30, 8)
    more, *_ = vj.design.lanczos_variances(product, 30, 20)
    full, ritz, _ = vj.design.lanczos_variances(product, 30, 30)
    few, more = np.asarray(few), np.asarray(more)
    assert np.all(few <= more * (1 + 1e-10)) and np.all(more <= exact * (1 + 1e-10))  # nested Krylov spaces
    assert np.mean(more / exact) > np.mean(few / exact) + 0.1
    np.testing.assert_allclose(full, exact, rtol=1e-8)
    np.testing.assert_allclose(np.sort(ritz), np.linalg.eigvalsh(P), rtol=1e-8)


# --- the design loop ----------------------------------------------------------------------------------------------

D, N0 = 24, 6


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(8)
    w = rng.laplace(0.0, 0.3, size=D)
    M = rng.normal(size=(N0, D))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    y = M @ w + np.sqrt(NU2) * rng.normal(size=N0)
    return w, M, y


def test_conjugate_design_loop_matches_closed_forms(problem):
    w, M, y = problem
    sigma = np.linspace(0.3, 1.0, D)  # Gaussian prior on s = w: the conjugate model (distinct eigenvalues)
    result = vj.design.sequential(M, y, NU2, vj.Identity(D), vj.potentials.Gaussian(scale=sigma), vj.Laplace(),
                                  num_steps=3, rows_per_step=2, truth=w, keep_means=True,
                                  key=jax.random.PRNGKey(1))
    rows, values = result.rows, result.y
    assert rows.shape == (N0 + 6, D) and list(result.num_measurements) == [6, 8, 10, 12]
    for step, n in enumerate(result.num_measurements):
        A = rows[:n].T @ rows[:n] / NU2 + np.diag(1 / sigma**2)
        S = np.linalg.inv(A)
        mean = S @ rows[:n].T @ values[:n] / NU2
        np.testing.assert_allclose(result.means[step], mean, atol=1e-8)
        np.testing.assert_allclose(result.errors[step], np.linalg.norm(mean - w), rtol=1e-7)
        if step < 3:  # the next block: S's two leading eigenvectors, with the closed-form gain
            lam, vec = np.linalg.eigh(S)
            chosen = rows[n:n + 2]
            overlap = np.abs(chosen @ vec[:, ::-1][:, :2])
            np.testing.assert_allclose(np.sort(overlap.max(axis=1)), 1.0, atol=1e-6)
            np.testing.assert_allclose(result.gains[step], 0.5 * np.sum(np.log1p(lam[::-1][:2] / NU2)), rtol=1e-7)
    # the simulated measurements are M* w + noise of variance ν²
    resid = values[N0:] - rows[N0:] @ w
    assert np.all(np.abs(resid) < 5 * np.sqrt(NU2))


def test_designed_rows_reduce_entropy_more_than_random(problem):
    w, M, y = problem
    prior = vj.potentials.Laplace(scale=0.3)
    kwargs = dict(num_steps=4, rows_per_step=2, truth=w, key=jax.random.PRNGKey(2))
    entropies = {}
    designed = vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), design="free", **kwargs,
                                    callback=lambda k, post: entropies.setdefault(k, float(vj.design.entropy(post))))
    random = vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), design="random", **kwargs)
    h_designed = float(vj.design.entropy(designed.posterior))
    h_random = float(vj.design.entropy(random.posterior))
    h_start = entropies[0]
    assert entropies[4] == pytest.approx(h_designed)
    # each designed block is worth several nats more than a random one
    assert h_start - h_designed > (h_start - h_random) + 1.0
    assert np.all(designed.gains > random.gains)
    assert designed.errors[-1] < designed.errors[0]


def test_design_loop_default_newton_tolerance(problem):
    """The loop's G-KL fits stop at Newton tol 1e-6 (not the solver's 1e-10): fewer Newton steps, same design."""
    chevron = vj.GKL(covariance=vj.covariance.Chevron(6))
    assert vj.design.FIT_TOL == 1e-6
    assert vj.design.design_method(chevron).solver == vj.solvers.NewtonCG(tol=1e-6)
    assert vj.design.design_method(chevron, None) is chevron
    for kept in (vj.GKL(), vj.LVB(), vj.GKL(covariance=vj.covariance.Chevron(6), solver=vj.solvers.NewtonCG())):
        assert vj.design.design_method(kept) is kept  # the full family's fixed point, other methods, a given solver
    w, M, y = problem
    runs = {}
    for tol in (vj.design.FIT_TOL, None):  # None: the method as given, i.e. NewtonCG's default 1e-10
        iters = []
        runs[tol] = (vj.design.sequential(M, y, NU2, vj.Identity(D), vj.potentials.Laplace(scale=0.3), chevron,
                                          num_steps=1, rows_per_step=2, truth=w, keep_means=True, fit_tol=tol,
                                          key=jax.random.PRNGKey(4), warm_start=False,  # one compiled fit per tol
                                          callback=lambda k, p: iters.append(int(p.diagnostics.iterations))), iters)
    (loose, loose_iters), (tight, tight_iters) = runs[vj.design.FIT_TOL], runs[None]
    assert np.all(loose.converged) and np.all(tight.converged)
    assert sum(loose_iters) < sum(tight_iters)
    # a squared decrement of 1e-6 leaves the mean ~1e-3 posterior standard deviations from the optimum
    assert np.linalg.norm(loose.means - tight.means) < 1e-4 * np.linalg.norm(tight.means)
    np.testing.assert_allclose(loose.errors, tight.errors, rtol=1e-4)
    qa, qb = np.linalg.qr(loose.rows[N0:].T)[0], np.linalg.qr(tight.rows[N0:].T)[0]  # the same chosen plane
    np.testing.assert_allclose(np.linalg.svd(qa.T @ qb, compute_uv=False), 1.0, atol=1e-6)


def test_smoothed_laplace_keeps_its_scale_as_data():
    """The MAP baseline's smoothed Laplace holds τ and ε as array leaves: two images' models share one
    compiled fit (a closure over τ recompiled the MAP fit for every `sequential` call)."""
    a, b = vj.design.smoothed_laplace(0.1), vj.design.smoothed_laplace(0.14, smoothing=0.05)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    s = np.array([-1.0, 0.0, 0.3])
    eps = 0.05 * 0.14
    np.testing.assert_allclose(b.log_phi(s), -(np.sqrt(s**2 + eps**2) - eps) / 0.14 - np.log(0.28), rtol=1e-12)
    with pytest.raises(ValueError, match="scale"):
        vj.design.smoothed_laplace(-1.0)


def _signature(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    return jax.tree_util.tree_structure(tree), [(np.shape(x), jnp.asarray(x).dtype) for x in leaves]


def test_map_baseline_fits_the_smoothed_prior(problem, monkeypatch):
    """The random-design MAP baseline fits the smoothed Laplace (`map_smoothing`): the loop's last fit is
    MAP on the final measurements under `smoothed_laplace` (which the model builder once refused). Every fit
    of the loop starts from a State of one form, so the cold fit and the warm refits share one compiled program."""
    w, M, y = problem
    inits = []

    def infer(model, method, init=None):
        inits.append(_signature((model, method.start(model) if init is None else method.to_state(model, init))))
        return vj.infer(model, method, init)

    monkeypatch.setattr(importlib.import_module("vijax.design.sequential"), "infer", infer)
    result = vj.design.sequential(M, y, NU2, vj.Identity(D), vj.potentials.Laplace(scale=0.3), vj.MAP(), 2,
                                  rows_per_step=2, design="random", truth=w)
    assert np.all(result.converged) and len(inits) == 3 and inits[0] == inits[1] == inits[2]
    direct = vj.infer(vj.design.sparse_linear_model(result.rows, result.y, NU2, vj.Identity(D),
                                                    vj.design.smoothed_laplace(0.3)), vj.MAP())
    np.testing.assert_allclose(result.posterior.mean, direct.mean, atol=1e-6)


@pytest.mark.parametrize("method", [vj.design.design_method(vj.GKL(covariance=vj.covariance.Chevron(6))),
                                    vj.LVB(variances="lanczos", num_lanczos=8, tol=1e-2, max_iter=30)],
                         ids=["gkl-chevron", "lvb-lanczos"])
def test_loop_starts_cold_and_warm_fits_alike(problem, method):
    """A cold start (`method.start`) and the warm start from the last posterior (its State) have one form,
    so a design loop compiles its fit once."""
    w, M, y = problem
    model = vj.design.sparse_linear_model(M, y, NU2, vj.Identity(D), vj.potentials.Laplace(scale=0.3))
    cold = method.start(model)
    post = vj.infer(model, method, init=cold)
    assert bool(post.diagnostics.converged) and _signature(cold) == _signature(method.to_state(model, post))


def test_sequential_validation(problem):
    w, M, y = problem
    prior = vj.potentials.Laplace(scale=0.3)
    with pytest.raises(ValueError, match="design"):
        vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), 1, design="best", truth=w)
    with pytest.raises(ValueError, match="exactly one of"):
        vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), 1)
    with pytest.raises(ValueError, match="candidates"):
        vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), 1, design="greedy", truth=w)
    with pytest.raises(ValueError, match="method"):
        vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB, 1, truth=w)
    with pytest.raises(ValueError, match="fit_tol"):
        vj.design.sequential(M, y, NU2, vj.Identity(D), prior, vj.LVB(), 1, truth=w, fit_tol=0.0)


@pytest.mark.parametrize("namespace", [vj.design, vj.design.filters])
def test_public_names(namespace):
    assert "design" in vj.__all__
    assert sorted(dir(namespace)) == sorted(namespace.__all__)
    for name in namespace.__all__:
        assert hasattr(namespace, name), name


@pytest.mark.parametrize("method,design", [(vj.GKL(), "free"), (vj.GKL(covariance=vj.covariance.Chevron(6)), "free"),
                                           (vj.EP(power=0.9), "free"), (vj.MAP(), "random"),
                                           (vj.LVB(variances="lanczos", num_lanczos=D), "free")],
                         ids=["gkl", "gkl-chevron", "ep-power-0.9", "map", "lvb-lanczos"])
def test_every_method_runs_the_loop(problem, method, design):
    w, M, y = problem
    result = vj.design.sequential(M, y, NU2, vj.Identity(D), vj.potentials.Laplace(scale=0.3), method, num_steps=4,
                                  rows_per_step=2, design=design, truth=w, key=jax.random.PRNGKey(3))
    assert np.all(np.isfinite(result.errors)) and result.errors[-1] < result.errors[0]
    assert np.all(result.converged)


@pytest.mark.slow
def test_image_filters_in_a_model():
    shape = (8, 8)
    B = filters.stack(filters.finite_differences(shape, periodic=True), filters.wavelets(shape, levels=1))
    rng = np.random.default_rng(10)
    image = np.cumsum(rng.normal(size=shape), axis=1).ravel() / 4
    M = rng.normal(size=(20, 64))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    dense = np.asarray(filters.as_dense(B))
    tau = 0.2
    model = vj.design.sparse_linear_model(M, M @ image, NU2, B, vj.potentials.Laplace(scale=tau))
    reference = vj.design.sparse_linear_model(M, M @ image, NU2, dense, vj.potentials.Laplace(scale=tau))
    for method in (vj.GKL(covariance=vj.covariance.Chevron(8)), vj.LVB()):
        a, b = vj.infer(model, method), vj.infer(reference, method)
        np.testing.assert_allclose(a.mean, b.mean, atol=1e-6)
        np.testing.assert_allclose(a.log_z, b.log_z, rtol=1e-8)
