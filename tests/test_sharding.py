"""`vj.shard_sites`: sites split over 4 (forced host) devices give the single-device answers."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

import vijax as vj

SCRIPT = textwrap.dedent("""
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import vijax as vj
    from jax.flatten_util import ravel_pytree

    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    N, D = 1003, 7  # 1003 = 4 * 250 + 3: a sharded part and a replicated remainder
    X = rng.normal(size=(N, D))
    y = (X @ rng.normal(size=D) + rng.normal(size=N) > 0).astype(float)
    counts = rng.poisson(2.0, size=N).astype(float)
    model = vj.LatentLinearModel(
        vj.GaussianFactor.diagonal(np.linspace(0.5, 2.0, D)),
        (vj.glm.logistic_regression(X, y).sites[0],
         vj.Sites(0.3 * X, vj.potentials.Poisson(counts), offset=rng.normal(size=N)),  # per-site parameters
         vj.Sites(vj.Identity(D), vj.potentials.Laplace(0.0, 1.0))))
    sharded = vj.shard_sites(model)

    H = sharded.sites[0].projection.matrix
    layout = dict(num_groups=len(sharded.sites), row_sharded=H.sharding.spec == jax.sharding.PartitionSpec("sites"),
                  shard_rows=sorted({s.data.shape[0] for s in H.addressable_shards}),
                  counts_rows=sorted({s.data.shape[0] for s in sharded.sites[2].potential.counts.addressable_shards}))

    out = dict(layout=layout)
    for name, cov in [("full", vj.covariance.Full()), ("chevron", vj.covariance.Chevron(2))]:
        params = vj.GKL(covariance=cov, solver=vj.solvers.NewtonCG()).start(model)
        x, unravel = ravel_pytree(params)
        x = x + 0.01 * jnp.asarray(rng.normal(size=x.shape))
        value_and_grad = jax.jit(jax.value_and_grad(lambda v, m: vj.gkl.bound(unravel(v), m)))
        f1, g1 = value_and_grad(x, model)
        f4, g4 = value_and_grad(x, sharded)
        fit = jax.jit(lambda m: vj.infer(m, vj.GKL(covariance=cov, solver=vj.solvers.NewtonCG(tol=1e-9))))
        p1, p4 = fit(model), fit(sharded)
        out[name] = dict(bound=abs(float(f1 - f4)) / abs(float(f1)), grad=float(jnp.max(jnp.abs(g1 - g4))),
                         log_z=abs(float(p1.log_z - p4.log_z)), mean=float(jnp.max(jnp.abs(p1.mean - p4.mean))),
                         converged=bool(p1.diagnostics.converged) and bool(p4.diagnostics.converged))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_sharded_bound_gradient_and_fit_equal_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    # Logistic 1003 rows -> 1000 sharded (250 per device) + 3 replicated; Poisson likewise; Identity kept whole.
    assert out["layout"] == dict(num_groups=5, row_sharded=True, shard_rows=[250], counts_rows=[250])
    for name in ("full", "chevron"):
        r = out[name]
        assert r["converged"], name
        assert r["bound"] <= 1e-12 and r["grad"] <= 1e-10, (name, r)
        assert r["log_z"] <= 1e-8 and r["mean"] <= 1e-8, (name, r)


def test_shard_sites_rejects_sparse_projections_and_unknown_axes():
    H = jsparse.BCOO.fromdense(jnp.eye(3)[:2])
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3), vj.Sites(H, vj.potentials.Logistic()))
    with pytest.raises(ValueError, match="sparse"):
        vj.shard_sites(model)
    dense = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3), vj.Sites(jnp.eye(3)[:2], vj.potentials.Logistic()))
    with pytest.raises(ValueError, match="axis_name"):
        vj.shard_sites(dense, mesh=jax.make_mesh((1,), ("sites",)), axis_name="rows")


def test_shard_sites_on_one_device_is_the_same_model(rng):
    X = rng.normal(size=(20, 3))
    model = vj.glm.logistic_regression(X, (X[:, 0] > 0).astype(float))
    post = vj.infer(vj.shard_sites(model), vj.GKL())
    np.testing.assert_allclose(post.log_z, vj.infer(model, vj.GKL()).log_z, rtol=1e-12)
