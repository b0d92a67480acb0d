"""vj.plot: every helper renders a PNG with the Agg backend and draws what it was given."""

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import jax.numpy as jnp
import matplotlib.pyplot as plt

import vijax as vj


@pytest.fixture(scope="module")
def fits():
    # Conjugate models: Laplace is exact and compiles quickly; the GP has a Gaussian likelihood.
    x = np.linspace(-2.0, 2.0, 12)
    X = np.stack([x, x**2, np.ones(12)], axis=1)
    t = np.sin(x)
    glm = vj.glm.linear_regression(X, t, noise_scale=0.3)
    gp = vj.gp.model(vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0), x[:, None],
                     vj.potentials.Gaussian(loc=t, scale=0.3))
    return {"x": x, "t": t, "glm": vj.infer(glm, vj.Laplace()), "gp": vj.infer(gp, vj.Laplace())}


def _render(ax, path):
    ax.figure.savefig(path)
    plt.close(ax.figure)
    assert path.stat().st_size > 1000


def test_coefficients(fits, tmp_path):
    ax = vj.plot.coefficients(fits["glm"], names=["x", "x²", "1"])
    bars = ax.containers
    assert len(bars) == 1  # one errorbar container per fit
    np.testing.assert_allclose(bars[0].lines[0].get_ydata(), fits["glm"].mean)
    _render(ax, tmp_path / "coefficients.png")


def test_gp_bands(fits, tmp_path):
    grid = jnp.linspace(-3.0, 3.0, 50)
    ax = vj.plot.gp_bands(fits["gp"], grid, fits["x"], fits["t"])
    mean, _ = vj.gp.predict(fits["gp"], grid[:, None])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), mean)
    _render(ax, tmp_path / "gp.png")


def test_convergence_and_compare(fits, tmp_path):
    fig, (left, middle, right) = plt.subplots(1, 3)
    vj.plot.convergence({"Laplace": fits["glm"]}, ax=left)
    vj.plot.convergence({"Laplace": fits["glm"]}, ax=middle, gap=True)
    vj.plot.compare({"Laplace": fits["glm"], "GP": fits["gp"], "a number": -3.0}, ax=right)
    trace = np.asarray(fits["glm"].diagnostics.objective_trace)
    np.testing.assert_allclose(left.lines[0].get_ydata(), trace[np.isfinite(trace)])
    widths = [p.get_width() + p.get_x() for p in right.patches]
    np.testing.assert_allclose(widths, [fits["glm"].log_z, fits["gp"].log_z, -3.0])
    # Laplace gives no bound: hatched; a plain number is drawn as a bound would be.
    assert [p.get_hatch() for p in right.patches] == ["//", "//", None]
    _render(left, tmp_path / "convergence.png")
