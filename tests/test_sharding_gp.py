"""`vj.shard_sites` on models whose sites are one per coordinate (`vj.gp.model`), and its refusals."""

import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest

import vijax as vj
from vijax.model import AbstractProjection, Dense, ScaledIdentity

SCRIPT = textwrap.dedent("""
    import json
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import vijax as vj
    from vijax.model import ScaledIdentity

    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(1)
    N = 41  # more sites than devices, and not a multiple of 4
    X = rng.uniform(-3.0, 3.0, size=(N, 2))
    labels = (np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=N) > 0).astype(float)
    kernel = vj.gp.kernels.SquaredExponential(lengthscale=1.3, variance=2.0)
    classification = vj.gp.model(kernel, X, vj.potentials.Probit(), labels=labels)  # H = diag(±1)
    regression = vj.gp.model(kernel, X, vj.potentials.StudentT(df=4.0, loc=np.sin(X[:, 0]), scale=0.3))  # H = I
    assert isinstance(classification.sites[0].projection, ScaledIdentity)

    out = {}
    for model_name, model in [("classification", classification), ("regression", regression)]:
        sharded = vj.shard_sites(model)
        scale = getattr(sharded.sites[0].projection, "scale", None)
        layout = dict(num_groups=len(sharded.sites),
                      prior_replicated=bool(sharded.prior.cov.sharding.is_fully_replicated),
                      sites_replicated=scale is None or bool(scale.sharding.is_fully_replicated),
                      num_devices=len(sharded.prior.cov.sharding.device_set))
        for method_name, method in [("gkl", vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-10))), ("ep", vj.EP())]:
            fit = jax.jit(lambda m: vj.infer(m, method))
            p1, p4 = fit(model), fit(sharded)
            out[model_name + "/" + method_name] = dict(
                layout=layout, log_z=float(p1.log_z), log_z_diff=abs(float(p1.log_z - p4.log_z)),
                mean_diff=float(jnp.max(jnp.abs(p1.mean - p4.mean))), mean_scale=float(jnp.max(jnp.abs(p1.mean))),
                converged=bool(p1.diagnostics.converged) and bool(p4.diagnostics.converged))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow
def test_sharded_gp_models_equal_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert sorted(out) == ["classification/ep", "classification/gkl", "regression/ep", "regression/gkl"]
    for name, r in out.items():
        # One group, laid over all four devices and replicated (41 sites per coordinate are not split).
        assert r["layout"] == dict(num_groups=1, prior_replicated=True, sites_replicated=True, num_devices=4), name
        assert r["converged"], (name, r)
        assert r["log_z"] < 0 and r["mean_scale"] > 0.1, (name, r)  # a real fit, not a degenerate one
        assert r["log_z_diff"] <= 1e-10 and r["mean_diff"] <= 1e-10, (name, r)


class _Doubled(AbstractProjection):
    """H = 2 I: a projection type that `shard_sites` does not know."""

    dim: int

    @property
    def shape(self):
        return (self.dim, self.dim)

    def mv(self, x):
        return 2 * x

    def rmv(self, y):
        return 2 * y

    def squared_mv(self, v):
        return 4 * v

    def squared_rmv(self, w):
        return 4 * w

    def gram(self, w):
        return jnp.diag(4 * w)

    def right_multiply(self, L):
        return 2 * L


def test_shard_sites_rejects_unknown_projection_types():
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3), vj.Sites(_Doubled(3), vj.potentials.Logistic()))
    with pytest.raises(ValueError, match=r"site group 0 has a _Doubled projection.*dense H"):
        vj.shard_sites(model)


def test_shard_sites_keeps_every_known_projection_type_on_one_device():
    # Dense, Identity and ScaledIdentity groups side by side: on one device the model is unchanged.
    signs = jnp.array([1.0, -1.0, 1.0])
    model = vj.LatentLinearModel(
        vj.GaussianFactor.isotropic(3),
        (vj.Sites(jnp.arange(6.0).reshape(2, 3) / 6, vj.potentials.Logistic()),
         vj.Sites(vj.Identity(3), vj.potentials.Laplace(0.0, 1.0)),
         vj.Sites(ScaledIdentity(signs), vj.potentials.Probit())))
    sharded = vj.shard_sites(model)
    assert [type(g.projection) for g in sharded.sites] == [Dense, vj.Identity, ScaledIdentity]
    assert jnp.array_equal(sharded.sites[2].projection.scale, signs)
    assert jnp.array_equal(sharded.sites[0].projection.matrix, model.sites[0].projection.matrix)
