"""Projection products (dense, sparse, identity) against dense NumPy, including their gradients."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

from vijax.projections import Sparse


def _random_sparse(rng, n, d, density):
    A = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    return A, jsparse.BCOO.fromdense(A)


@eqx.filter_jit
def _products(P, xs, ys, w, V):
    """Every product of ``P`` (one program, not one per primitive)."""
    return ([(P.mv(x), P.squared_mv(x)) for x in xs], [(P.rmv(y), P.squared_rmv(y)) for y in ys], P.gram(w),
            jax.grad(lambda V: jnp.sum(jnp.sin(P.mv(V))))(V))


def _check_products(P, A, rng):
    n, d = A.shape
    xs, ys = (rng.normal(size=d), rng.normal(size=(d, 3))), (rng.normal(size=n), rng.normal(size=(n, 3)))
    w, V = rng.uniform(size=n), rng.normal(size=(d, 4))
    forward, backward, gram, grad = _products(P, xs, ys, w, V)
    for x, (mv, squared_mv) in zip(xs, forward):
        np.testing.assert_allclose(mv, A @ x, atol=1e-12)
        np.testing.assert_allclose(squared_mv, (A**2) @ x, atol=1e-12)
    for y, (rmv, squared_rmv) in zip(ys, backward):
        np.testing.assert_allclose(rmv, A.T @ y, atol=1e-12)
        np.testing.assert_allclose(squared_rmv, (A**2).T @ y, atol=1e-12)
    np.testing.assert_allclose(gram, A.T @ (w[:, None] * A), atol=1e-12)
    np.testing.assert_allclose(grad, A.T @ np.cos(A @ V), atol=1e-12)


@pytest.mark.parametrize("n, d, density", [(50, 7, 0.3), (1500, 40, 0.05), (3, 2, 1.0)])
def test_sparse_products_match_dense(rng, n, d, density):
    A, H = _random_sparse(rng, n, d, density)
    P = Sparse.from_bcoo(H)
    assert P.ell_values is not None  # the blocked layout is in use
    _check_products(P, A, rng)


def test_sparse_with_duplicate_and_unsorted_indices_sums_duplicates(rng):
    H = jsparse.BCOO((jnp.array([1.0, 2.0, 3.0, -1.0]), jnp.array([[2, 1], [0, 0], [2, 1], [1, 0]])), shape=(3, 2))
    A = np.asarray(H.todense())
    assert A[2, 1] == 4.0
    _check_products(Sparse.from_bcoo(H), A, rng)


def test_sparse_falls_back_to_bcoo_products_when_the_layout_cannot_be_built(rng):
    A, H = _random_sparse(rng, 60, 30, 0.05)
    A[0] = rng.normal(size=30)  # one row far longer than the rest: padding would waste > 8×
    H = jsparse.BCOO.fromdense(A)
    P = Sparse.from_bcoo(H)
    assert P.ell_values is None
    _check_products(P, A, rng)
    # Under tracing the indices are not known, so the BCOO products are used too.
    x = rng.normal(size=30)
    np.testing.assert_allclose(jax.jit(lambda H: Sparse.from_bcoo(H).mv(x))(H), A @ x, atol=1e-12)


def test_sparse_products_keep_float32(rng):
    A, H = _random_sparse(rng, 80, 10, 0.2)
    P = Sparse.from_bcoo(jsparse.BCOO((H.data.astype(jnp.float32), H.indices), shape=H.shape))
    out = P.mv(jnp.ones((10, 2), jnp.float32))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, A @ np.ones((10, 2)), rtol=1e-5, atol=1e-5)
