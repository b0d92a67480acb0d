"""Projection products (dense, sparse, identity) against dense NumPy, including their gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

from vijax.projections import Sparse


def _random_sparse(rng, n, d, density):
    A = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    return A, jsparse.BCOO.fromdense(A)


def _check_products(P, A, rng):
    n, d = A.shape
    for x in (rng.normal(size=d), rng.normal(size=(d, 3))):
        np.testing.assert_allclose(P.mv(x), A @ x, atol=1e-12)
        np.testing.assert_allclose(P.squared_mv(x), (A**2) @ x, atol=1e-12)
    for y in (rng.normal(size=n), rng.normal(size=(n, 3))):
        np.testing.assert_allclose(P.rmv(y), A.T @ y, atol=1e-12)
        np.testing.assert_allclose(P.squared_rmv(y), (A**2).T @ y, atol=1e-12)
    w = rng.uniform(size=n)
    np.testing.assert_allclose(P.gram(w), A.T @ (w[:, None] * A), atol=1e-12)
    V = jnp.asarray(rng.normal(size=(d, 4)))
    grad = jax.grad(lambda V: jnp.sum(jnp.sin(P.mv(V))))(V)
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
